"""Hostile input around the Vulkan driver.

Toward the arbiter: a hello whose ``device_info`` is not a flag is refused beside an honest client, and
the connection may say hello again; the honest answer is the description device_info.py defines.
Toward the driver: a listener in the pipe directory that answers the driver's hello with a broken
welcome (bad framing, lengths, JSON, descriptors, fields) must leave the program with no device and
an explanation, never a crash; the same listener's good welcome gives a device
(tests/icd/test_c_program.py, where the driver runs under the sanitizers). The welcome's
``load_timeout``, which sets how long a pipeline's creation waits for the arbiter, is read by
tests/icd/load_unit.c, built with the driver's sources and the sanitizers: a value that is not a
number, is 0 or below, or is past 1e6 s gives the driver's own bound, never a wait of nothing, a
negative one or an overflow.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from libshare.icd import _build
from libshare.protocol import wire as protocol

from tests.conftest import stop_process
from tests.arbiter.conftest import start_client
from tests.icd._broken import BROKEN, PROPERTIES_SIZE, BrokenArbiter, frame
from tests.icd.conftest import PROBE, environment, libshare_run, probe
from tests.icd.test_c_program import SANITIZE

LOAD_UNIT = Path(__file__).resolve().parent / "load_unit.c"

def icd_constant(name: str) -> int:
    """A number icd.h defines."""
    return int(re.search(rf"#define {name} (\d+)", (Path(_build.HERE) / "icd.h").read_text())[1])


DRIVER_BOUND_MS, MARGIN_MS = icd_constant("LS_ICD_LOAD_MS"), icd_constant("LS_ICD_LOAD_MARGIN_MS")

def test_a_hostile_device_info_flag_is_refused_beside_an_honest_client(daemon):
    _process, pipe_dir = daemon
    honest = start_client("mixed", pipe_dir, 3, 20)  # checks every result against numpy
    try:
        sock = protocol.dial(pipe_dir / "control", 30.0)
        sock.settimeout(60)
        with sock:
            for value in (1, "true", None, [True], {"": True}):
                sock.sendall(frame(json.dumps({"op": "hello", "version": 1, "device_info": value}).encode()))
                answer = protocol.recv(sock, max_fds=protocol.MAX_FDS)
                answer.close_fds()
                assert answer.fields["ok"] is False and answer.fields["error"] == "InvalidSubmission", value
            sock.sendall(frame(json.dumps({"op": "hello", "version": 1, "device_info": True}).encode()))
            welcome = protocol.recv(sock, max_fds=protocol.MAX_FDS)
            welcome.close_fds()
        described = welcome.fields["physical_device"]
        assert welcome.fields["ok"] and len(welcome.payload) == PROPERTIES_SIZE
        assert described["name"] == welcome.fields["device"] and "robustBufferAccess" in described["features"]
        assert "bufferDeviceAddress" not in described["features"] and described["memory"] > 0
        assert honest.communicate(timeout=300)[0].strip() == "ok"
    finally:
        stop_process(honest)


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_welcome_leaves_the_program_no_device_and_no_crash(tmp_path, case):
    # The program is the one at risk here; the same listener's good welcome is test_c_program.py's honest case.
    answer, fds = BROKEN[case]
    arbiter = BrokenArbiter(tmp_path / "broken", answer, fds)
    try:
        seen = probe(libshare_run("--mode", "daemon", "--name", "victim", "--group", "g", "--", sys.executable,
                                  str(PROBE)), environment(tmp_path / "broken", LIBSHARE_DEVICE_MEM_LIMIT="0=1G,2M"))
    finally:
        arbiter.close()
    assert seen["error"] == "VkErrorIncompatibleDriver", seen  # the loader's answer: its only driver failed
    assert "libshare Vulkan driver:" in seen["stderr"]
    assert arbiter.hello == {"op": "hello", "name": "victim", "version": 1, "device_info": True, "group": "g",
                             "mem_limit": {"0": 1 << 30, "": 2 << 20}}


def test_a_hostile_load_timeout_gives_the_drivers_own_bound(tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    program = tmp_path / "load_unit"
    subprocess.run(["cc", "-O1", "-g", "-std=gnu11", f"-I{_build.HERE}", f"-I{_build.RING}", *SANITIZE, "-o",
                    str(program), str(LOAD_UNIT), *map(str, _build.SOURCES), "-lcjson", "-lm", "-lpthread"], check=True)
    cases = {"2010": 2010 * 1000 + MARGIN_MS,  # the arbiter's default bound, and the margin
             "1000000": 1_000_000 * 1000 + MARGIN_MS,  # the largest believed: no int overflow
             "100": DRIVER_BOUND_MS,  # shorter than the driver's own bound: that
             "0": DRIVER_BOUND_MS, "-5": DRIVER_BOUND_MS, "1000000.5": DRIVER_BOUND_MS, "1e300": DRIVER_BOUND_MS,
             "-1e300": DRIVER_BOUND_MS, "\"2010\"": DRIVER_BOUND_MS, "null": DRIVER_BOUND_MS, "[2010]": DRIVER_BOUND_MS,
             "{\"seconds\": 2010}": DRIVER_BOUND_MS, "true": DRIVER_BOUND_MS, "not json": DRIVER_BOUND_MS}
    done = subprocess.run([str(program)], input="\n".join(cases) + "\n", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Sanitizer" not in done.stderr and "runtime error" not in done.stderr, done.stderr
    assert dict(zip(cases, map(int, done.stdout.split()))) == cases
