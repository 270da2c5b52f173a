"""``ps`` prints what clients wrote (their name, their command line) escaped: no injected rows, no terminal escapes."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT
from tests.control.conftest import control

FAKE_ROW = "4242  99  root-job  0:00000000  ACTIVE  high  0  0.0ms  0B  unlimited  /usr/bin/fake"

# Run with -c: the command line that ps shows begins with terminal escapes and, after a newline, a fake row.
_CLIENT = ("'''\x1b]0;title\x07\u2028\n" + FAKE_ROW + "\n'''\n"
           "import sys, libshare\n"
           "with libshare.connect(mode='daemon', pipe_directory=sys.argv[1], name='evil\\nname\\x1b[2J'):\n"
           "    print('ready', flush=True)\n"
           "    sys.stdin.readline()\n")


def test_ps_escapes_names_and_command_lines(dirs, daemon):
    client = subprocess.Popen([sys.executable, "-c", _CLIENT, str(dirs.pipe)], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "ready"
        result = control(*dirs.args, "ps")
        assert result.returncode == 0, result.stderr
        header, *rows = result.stdout.splitlines()
        assert len(rows) == 1, result.stdout  # one client, one row: the fake one is no row
        row = rows[0]
        assert row.split()[0] == str(client.pid)
        assert not {"\x1b", "\x07", "\u2028"} & set(result.stdout), result.stdout
        assert row.split()[2] == "evil\\nname\\x1b[2J"  # the name stays one column
        if len(sys.executable) < 40:  # the newline is within the 80 characters shown
            assert f"\\x07\\u2028\\n{FAKE_ROW[:20]}" in row, row  # escaped, not cut
        assert control(*dirs.args, "ps", "-p", str(client.pid)).stdout.splitlines()[1:] == rows
    finally:
        client.communicate("\n", timeout=60)
