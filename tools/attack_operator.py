"""The long attacks on the operator plane (issue 32): the configuration file, server.log, the shader cache.

Run from anywhere; the libshare it attacks is the one ``import libshare`` finds, so PYTHONPATH
picks a checkout (the arbiter runs in /, where only PYTHONPATH and the installed one are seen)::

    .venv/bin/python tools/attack_operator.py --attaches 2000 --modules 200
    cd /tmp && PYTHONPATH=/tmp/before /work/main/.venv/bin/python /work/main/tools/attack_operator.py

It starts a control daemon (``libshare-control -f --config FILE``) on a temporary pipe
directory, with ``LIBSHARE_LOG_MAX_SIZE`` and ``LIBSHARE_SHADER_CACHE_MAX_SIZE`` set low (an
arbiter without those bounds ignores them), and an honest session in this process that does
saxpy round trips checked against numpy throughout. Then:

1. **attaches**: ``--attaches`` sessions connect and leave, one after another; the figures are
   server.log's growth per attach, the attach rate, the growth it makes in an hour, and what
   server.log and its rotated copy hold at the end;
2. **modules**: one session loads, runs and frees ``--modules`` distinct kernels (a float constant
   changed in the SPIR-V, so each is a new shader-cache entry); the figures are the entries and
   bytes in the shader cache at the end, per module, and in an hour at that rate;
3. **config**: the file is replaced by one with 50,000 nested arrays; ``reload`` is asked (its
   answer is shown), SIGHUP is sent twice (the hostile file, then a good changed one: was the
   good one applied, i.e. did the signal thread survive?), and ``libshare-control -f --config``
   with the hostile file is started on another pipe directory (exit status, traceback or not);
4. **long line**: a file whose bad key follows a line of ``--long-line`` spaces, and the time the
   ``reload`` command takes to refuse it (``--reload-timeout`` at most; the arbiter may be stuck
   after that, which is why this phase is last).

A progress line goes to stderr. It prints the figures as plain lines, and ``--json FILE``
writes them as JSON. Exit status 1 when an honest round trip failed or gave a wrong result.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import libshare
from libshare.protocol import paths as _paths

sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH: libshare stays its
from tests.control.test_disk_bounds import cache_usage, run_distinct, salted_module  # noqa: E402

GOOD = """[defaults]
priority = "normal"

[groups.batch]
active_thread_percentage = {share}
"""
NESTED = "[defaults]\nscheduling = " + "[" * 50_000 + "]" * 50_000 + "\n"
def progress(phase: str, done: int, total: int) -> None:
    print(f"\r{phase}: {done}/{total}", end="", file=sys.stderr, flush=True)
    if done >= total:
        print(file=sys.stderr)


# ------------------------------------------------------------------ the honest session

class Honest(threading.Thread):
    """Saxpy round trips checked against numpy until :meth:`stop`; counts them."""

    def __init__(self, pipe_dir: Path):
        super().__init__(name="honest", daemon=True)
        self.pipe_dir, self.ok, self.wrong, self.failed, self.errors = pipe_dir, 0, 0, 0, []
        self._stop_event = threading.Event()

    def run(self) -> None:
        with libshare.connect(name="honest", mode="daemon", pipe_directory=self.pipe_dir) as session:
            program = session.load_program(libshare.shaders.path("saxpy"))
            x, y = session.array(1024, np.float32), session.array(1024, np.float32)
            while not self._stop_event.is_set():
                a = float(self.ok % 7 + 1)
                x[:], y[:] = np.arange(1024, dtype=np.float32), 1.0
                try:
                    session.dispatch(program, 16, [x, y], struct.pack("If", 1024, a)).wait(60)
                except libshare.LibshareError as exc:
                    self.failed += 1
                    self.errors.append(repr(exc)[:200])
                    continue
                good = np.array_equal(y, a * np.arange(1024, dtype=np.float32) + 1.0)
                self.ok += good
                self.wrong += not good
                self._stop_event.wait(0.005)  # a pace, not a synchronisation

    def stop(self) -> dict:
        self._stop_event.set()
        self.join(120)
        return {"round_trips": self.ok, "wrong": self.wrong, "failed": self.failed, "errors": self.errors[:5]}


# ------------------------------------------------------------------ the daemon

def control(pipe_dir: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "libshare.control", "--pipe-directory", str(pipe_dir), *args],
                          cwd="/", capture_output=True, text=True, timeout=timeout)


def start_daemon(pipe_dir: Path, config: Path, env: dict) -> subprocess.Popen:
    stderr = open(pipe_dir.parent / "daemon.stderr", "w")
    process = subprocess.Popen([sys.executable, "-m", "libshare.control", "-f", "--pipe-directory", str(pipe_dir),
                                "--config", str(config)], cwd="/", stdout=subprocess.DEVNULL, stderr=stderr,
                               env={**os.environ, **env})
    deadline = time.monotonic() + 120
    while control(pipe_dir, "get_server_status", timeout=30).stdout.strip() != "ACTIVE":
        if process.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"the daemon did not start: {(pipe_dir.parent / 'daemon.stderr').read_text()[-2000:]}")
        time.sleep(0.2)
    return process


def pid_in(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def stop_daemon(process: subprocess.Popen, pipe_dir: Path) -> None:
    arbiter = pid_in(_paths.lock_path(pipe_dir))
    process.terminate()
    try:
        process.wait(40)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    try:  # still there (a reload that never ends holds the GIL, and SIGTERM waits for it)?
        ours = arbiter is not None and str(pipe_dir).encode() in Path(f"/proc/{arbiter}/cmdline").read_bytes()
    except OSError:
        ours = False
    if ours:
        os.kill(arbiter, signal.SIGKILL)


# ------------------------------------------------------------------ the attacks

def attaches(pipe_dir: Path, total: int) -> dict:
    """``total`` sessions that connect and leave; server.log's growth per attach is measured until
    its first rotation."""
    log = pipe_dir / "server.log"
    first_inode, started = log.stat().st_ino, time.monotonic()
    growth = counted = rotations = 0
    size, inode = log.stat().st_size, first_inode
    for n in range(total):
        with libshare.connect(name=f"attacker-{n}", mode="daemon", pipe_directory=pipe_dir):
            pass
        now = log.stat()
        if now.st_ino == first_inode:
            growth, counted = growth + now.st_size - size, counted + 1
        rotations += now.st_ino != inode
        size, inode = now.st_size, now.st_ino
        if n % 50 == 49 or n == total - 1:
            progress("attaches", n + 1, total)
    rate = total / (time.monotonic() - started)
    time.sleep(1)  # the last disconnections are logged after the sessions end: a census
    rotated = Path(str(log) + ".1")
    kept = log.stat().st_size, rotated.stat().st_size if rotated.exists() else 0
    per_attach = growth / max(counted, 1)
    return {"attaches": total, "attaches_per_s": round(rate, 1), "rotations_seen": rotations,
            "server_log_bytes": kept[0], "server_log_1_bytes": kept[1], "log_bytes_total": sum(kept),
            "growth_bytes_per_attach": round(per_attach), "growth_mib_per_hour":
            round(per_attach * rate * 3600 / 2**20, 1)}


def modules(pipe_dir: Path, total: int, scratch: Path) -> dict:
    salted = salted_module(scratch)
    entries_before, bytes_before = cache_usage(pipe_dir)
    started = time.monotonic()
    with libshare.connect(name="attacker", mode="daemon", pipe_directory=pipe_dir) as attacker:
        run_distinct(attacker, salted, total,
                     lambda n: (n % 10 == 9 or n == total - 1) and progress("modules", n + 1, total))
    rate = total / (time.monotonic() - started)
    entries, used = cache_usage(pipe_dir)
    per_module = (used - bytes_before) / total
    return {"modules": total, "modules_per_s": round(rate, 2), "cache_entries": entries, "cache_bytes": used,
            "growth_bytes_per_module": round(per_module), "growth_mib_per_hour":
            round(per_module * rate * 3600 / 2**20, 1), "entries_added": entries - entries_before}


def wait_for(path: Path, text: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return True
        time.sleep(0.1)
    return False


def hostile_config(pipe_dir: Path, config: Path, scratch: Path) -> dict:
    config.write_text(NESTED)
    answer = control(pipe_dir, "reload")
    arbiter = pid_in(_paths.lock_path(pipe_dir))
    os.kill(arbiter, signal.SIGHUP)
    log = pipe_dir / "control.log"
    refused = wait_for(log, "not reloaded (SIGHUP)", 10)
    config.write_text(GOOD.format(share=30))
    os.kill(arbiter, signal.SIGHUP)
    applied = wait_for(log, "applied (SIGHUP): groups.batch.active_thread_percentage: 40 -> 30", 20)
    config.write_text(GOOD.format(share=40))
    hostile = scratch / "nested.toml"
    hostile.write_text(NESTED)
    other = scratch / "other"
    start = subprocess.run([sys.executable, "-m", "libshare.control", "-f", "--pipe-directory", str(other),
                            "--config", str(hostile)], cwd="/", capture_output=True, text=True, timeout=120)
    for path in (_paths.lock_path(other), _paths.supervisor_lock_path(other)):
        if (pid := pid_in(path)) is not None:
            os.kill(pid, signal.SIGTERM)
    return {"reload_answer": (answer.stdout + answer.stderr).strip().splitlines()[-1][:200],
            "sighup_refusal_logged": refused, "sighup_after_hostile_applied": applied,
            "foreground_exit_status": start.returncode, "foreground_traceback": "Traceback" in start.stderr,
            "foreground_says": start.stderr.strip().splitlines()[-1][:200] if start.stderr.strip() else ""}


def long_line(pipe_dir: Path, config: Path, spaces: int, timeout: float) -> dict:
    config.write_text('[defaults]\ndevice_mem_limit = """\n' + " " * spaces + '4G\n"""\ncolour = 1\n')
    started = time.monotonic()
    try:
        answer = control(pipe_dir, "reload", timeout=timeout)
        said = (answer.stdout + answer.stderr).strip().splitlines()[-1][:200]
    except subprocess.TimeoutExpired:
        said = f"no answer in {timeout:g} s"
    return {"spaces": spaces, "reload_seconds": round(time.monotonic() - started, 2), "reload_answer": said}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attaches", type=int, default=2000)
    parser.add_argument("--modules", type=int, default=200)
    parser.add_argument("--long-line", type=int, default=3000, help="spaces on the line before the bad key")
    parser.add_argument("--reload-timeout", type=float, default=60.0)
    parser.add_argument("--log-max-size", default="64K", help="LIBSHARE_LOG_MAX_SIZE of the arbiter")
    parser.add_argument("--cache-max-size", default="256K", help="LIBSHARE_SHADER_CACHE_MAX_SIZE of the arbiter")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    print(f"libshare from {Path(libshare.__file__).parent}", file=sys.stderr)
    env = {"LIBSHARE_LOG_MAX_SIZE": args.log_max_size, "LIBSHARE_SHADER_CACHE_MAX_SIZE": args.cache_max_size}
    for variable in ("MESA_SHADER_CACHE_DIR", "MESA_SHADER_CACHE_MAX_SIZE", "LIBSHARE_LOG_DIRECTORY"):
        os.environ.pop(variable, None)
    report: dict = {"libshare": str(Path(libshare.__file__).parent), "bounds": env}
    with tempfile.TemporaryDirectory() as tmp:
        scratch, pipe_dir, config = Path(tmp), Path(tmp) / "pipe", Path(tmp) / "libshare.toml"
        config.write_text(GOOD.format(share=40))
        daemon = start_daemon(pipe_dir, config, env)
        honest = Honest(pipe_dir)
        try:
            honest.start()
            report["attaches"] = attaches(pipe_dir, args.attaches)
            report["modules"] = modules(pipe_dir, args.modules, scratch)
            report["config"] = hostile_config(pipe_dir, config, scratch)
            report["honest"] = honest.stop()
            report["long_line"] = long_line(pipe_dir, config, args.long_line, args.reload_timeout)
        finally:
            stop_daemon(daemon, pipe_dir)
    for phase, figures in report.items():
        print(f"{phase}: " + (", ".join(f"{k}={v}" for k, v in figures.items()) if isinstance(figures, dict)
                              else str(figures)))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    honest_figures = report["honest"]
    return 1 if honest_figures["wrong"] or honest_figures["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
