"""The long metrics-endpoint run (issue 32): another uid's scrape, and slow-loris connections.

Run from the repository root (as root, for the second uid)::

    .venv/bin/python tools/attack_metrics.py --seconds 30 --slow 8 --interval 2

To measure another checkout (its compiled modules in place), put it first on the path and run
from elsewhere, so that ``libshare`` is imported from it (the run prints which one it uses)::

    cd /tmp && PYTHONPATH=/tmp/before /work/main/.venv/bin/python /work/main/tools/attack_metrics.py

It starts a daemon arbiter with ``--metrics-port`` in a temporary pipe directory, and an honest
client (named ``payroll-secret-7731``, in group ``finance``) doing checked saxpy round trips
throughout. Then:

1. labels: it scrapes as uid 65534 (``setpriv``) and as itself, and says whether the honest
   client's name or group reached each scrape;
2. slow-loris: it holds ``--slow`` connections that each send a byte of an endless request
   header every ``--interval`` seconds (reopened when the arbiter closes one), and meanwhile
   scrapes once a second for ``--seconds`` seconds;

and prints the figures: labels leaked (yes/no) per scraper, scrapes that succeeded of those
attempted under the slow connections, slow connections the arbiter closed, and the honest
client's round trips and wrong results. A progress line shows the slow-loris phase.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import libshare

LIBROOT = Path(libshare.__file__).resolve().parent.parent  # the checkout under test
NAME, GROUP = "payroll-secret-7731", "finance"

_HONEST = """
import json, signal, struct, sys, numpy as np, libshare
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
with libshare.connect(name=sys.argv[2], group=sys.argv[3], mode="daemon", pipe_directory=sys.argv[1]) as s:
    p = s.load_program(libshare.shaders.path("saxpy"))
    x, y = s.array(4096, np.float32), s.array(4096, np.float32)
    x[:] = np.arange(4096) % 100
    trips = wrong = 0
    print("ready", flush=True)
    while not stop:
        y[:] = 1.0
        s.dispatch(p, 64, [x, y], struct.pack("If", 4096, 2.0)).wait(timeout=60)
        trips += 1
        wrong += not np.array_equal(y, 1.0 + 2.0 * x)
print(json.dumps({"round_trips": trips, "wrong": wrong}), flush=True)
"""

_FOREIGN_SCRAPE = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode())"


def progress(phase: str, done: float, total: float, extra: str) -> None:
    """One progress line on stderr."""
    print(f"\r{phase}: {done:.0f}/{total:.0f} s {extra}", end="", file=sys.stderr, flush=True)


def free_port() -> int:
    """A TCP port free now on 127.0.0.1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def arbiter_serving(pipe_dir: Path, port: int):
    """A foreground arbiter of the checkout under test serving metrics on ``port``, from its first
    answered scrape until the block ends (then terminated)."""
    stderr = pipe_dir.parent / "arbiter.stderr"
    with open(stderr, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "libshare.arbiter", "--pipe-directory", str(pipe_dir),
                                    "--metrics-port", str(port)], cwd=LIBROOT, stdout=subprocess.DEVNULL, stderr=log)
    try:
        give_up = time.monotonic() + 60
        while not (pipe_dir / "control").exists() and process.poll() is None and time.monotonic() < give_up:
            time.sleep(0.05)
        if not (pipe_dir / "control").exists():
            sys.exit(f"the arbiter did not start: {stderr.read_text()[-2000:]}")
        yield process
    finally:
        process.terminate()
        process.wait(30)


def start_honest(pipe_dir: Path) -> subprocess.Popen:
    """The honest client, once it has done its setup."""
    client = subprocess.Popen([sys.executable, "-c", _HONEST, str(pipe_dir), NAME, GROUP], cwd=LIBROOT,
                              stdout=subprocess.PIPE, text=True)
    if client.stdout.readline().strip() != "ready":
        sys.exit("the honest client did not start")
    return client


def scrape(url: str, timeout: float = 10.0) -> str:
    """The endpoint's text (OSError when the scrape fails)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def labels(url: str) -> dict:
    """Whether the honest client's name or group reached a scrape of uid 65534's and of ours."""
    mine = scrape(url)
    report = {"own_uid": os.getuid(), "own_scrape_shows_name": NAME in mine or GROUP in mine}
    if os.getuid() != 0 or not shutil.which("setpriv"):
        report["uid_65534"] = "skipped: needs root and setpriv"
        return report
    foreign = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                              "-c", _FOREIGN_SCRAPE, url], capture_output=True, text=True, timeout=60)
    if foreign.returncode:
        report["uid_65534"] = f"scrape failed: {foreign.stderr.strip()[-300:]}"
        return report
    report["uid_65534_leaked_name"] = NAME in foreign.stdout
    report["uid_65534_leaked_group"] = GROUP in foreign.stdout
    report["uid_65534_client_series"] = sum(line.startswith("libshare_client_") for line in foreign.stdout.splitlines())
    return report


class SlowConnections:
    """``count`` connections each sending a byte of an endless header every ``interval`` seconds,
    each reopened when the arbiter closes it."""

    def __init__(self, port: int, count: int, interval: float):
        self.port, self.interval = port, interval
        self.closed_by_arbiter = 0
        self._stop = threading.Event()
        self._conns = [self._open() for _ in range(count)]
        self._thread = threading.Thread(target=self._dribble, daemon=True)
        self._thread.start()

    def _open(self) -> socket.socket:
        conn = socket.create_connection(("127.0.0.1", self.port))
        conn.setblocking(False)
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        return conn

    def _dribble(self) -> None:
        while not self._stop.wait(self.interval):
            for i, conn in enumerate(self._conns):
                try:
                    if conn.recv(4096) == b"":  # the arbiter closed it
                        raise ConnectionResetError
                except BlockingIOError:  # still open, nothing to read
                    pass
                except OSError:
                    conn.close()
                    self.closed_by_arbiter += 1
                    self._conns[i] = conn = self._open()
                try:
                    conn.send(b"a")
                except OSError:
                    pass

    def close(self) -> None:
        """Stop dribbling and close them all."""
        self._stop.set()
        self._thread.join()
        for conn in self._conns:
            conn.close()


def slow_loris(url: str, port: int, count: int, interval: float, seconds: float) -> dict:
    """Scrapes attempted and succeeded over ``seconds`` while ``count`` slow connections are held."""
    slow = SlowConnections(port, count, interval)
    attempted = succeeded = 0
    end = time.monotonic() + seconds
    try:
        while (now := time.monotonic()) < end:
            attempted += 1
            try:
                scrape(url, timeout=min(10.0, max(end - now, 1.0)))
                succeeded += 1
            except OSError:
                pass
            progress("slow-loris", seconds - max(end - time.monotonic(), 0), seconds,
                     f"scrapes {succeeded}/{attempted}, slow connections closed {slow.closed_by_arbiter}")
            time.sleep(1.0)
    finally:
        slow.close()
        print(file=sys.stderr)
    return {"slow_connections": count, "byte_every_s": interval, "seconds": seconds,
            "scrapes_attempted": attempted, "scrapes_succeeded": succeeded,
            "slow_connections_closed_by_arbiter": slow.closed_by_arbiter}


def main() -> int:
    """Run both attacks beside the honest client and print the figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the slow-loris phase")
    parser.add_argument("--slow", type=int, default=8, help="slow connections held open")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between two bytes of one")
    args = parser.parse_args()
    print(f"libshare from {libshare.__file__}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        pipe_dir, port = Path(tmp) / "pipe", free_port()
        url = f"http://127.0.0.1:{port}/metrics"
        with arbiter_serving(pipe_dir, port) as arbiter:
            honest = start_honest(pipe_dir)
            report = {"libshare": libshare.__file__, "labels": labels(url),
                      "slow_loris": slow_loris(url, port, args.slow, args.interval, args.seconds)}
            honest.terminate()
            lines = honest.communicate(timeout=60)[0].strip().splitlines()
            report["honest"] = json.loads(lines[-1]) if lines else {"exit": honest.returncode}
            report["arbiter_alive"] = arbiter.poll() is None
    print(json.dumps(report, indent=2))
    return 0 if report["arbiter_alive"] else 1


if __name__ == "__main__":
    sys.exit(main())
