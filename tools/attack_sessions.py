"""The long hostile-session run (issue 12): descriptors, control messages, a kill storm.

Run from the repository root::

    .venv/bin/python tools/attack_sessions.py --descriptors 1000000 --messages 100000 --kills 1000

It starts a daemon arbiter in a temporary pipe directory, then, with honest clients
checking their results throughout:

1. pushes ``--descriptors`` seeded hostile descriptors (``tests/arbiter/_descriptor_fuzz.py``);
2. sends ``--messages`` seeded hostile control messages (the generators of
   ``tests/arbiter/test_connection_attacks.py``), each of which must get an error reply;
3. starts ``--kills`` clients that connect, allocate, load a program and dispatch, and
   SIGKILLs each at a random moment, ``--parallel`` at a time;

and prints, before and after, the arbiter's open fds, memfds, threads and RSS, plus how
many honest round trips failed. A progress line shows how far each phase has got.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_VICTIM = """
import struct, sys, numpy as np, libshare
s = libshare.connect(mode="daemon", pipe_directory=sys.argv[1], name="victim")
p = s.load_program(libshare.shaders.path("saxpy")); x, y = s.array(4096), s.array(4096)
d = s.alloc(1 << 16, kind="device")
print("ready", flush=True)
while True:
    s.dispatch(p, 64, [x, y], struct.pack("If", 4096, 1.0)); s.copy(x, y)
"""


def census(pid: int) -> dict:
    """The arbiter's open fds, memfds, threads and RSS (KiB)."""
    fds = os.listdir(f"/proc/{pid}/fd")
    memfds = 0
    for fd in fds:
        try:
            memfds += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:")
        except OSError:
            pass
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {"fds": len(fds), "memfds": memfds, "threads": int(status["Threads"]),
            "rss_kib": int(status["VmRSS"].split()[0])}


def progress(phase: str, done: int, total: int) -> None:
    print(f"\r{phase}: {done}/{total}", end="", file=sys.stderr, flush=True)
    if done >= total:
        print(file=sys.stderr)


def start_arbiter(pipe_dir: Path, root: Path) -> subprocess.Popen:
    log = open(pipe_dir.parent / "arbiter.stderr", "w")
    process = subprocess.Popen([sys.executable, "-m", "libshare.arbiter", "--pipe-directory", str(pipe_dir),
                                "--max-clients", "256"], cwd=root, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 60
    while not (pipe_dir / "control").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"the arbiter did not start: {(pipe_dir.parent / 'arbiter.stderr').read_text()[-2000:]}")
        time.sleep(0.05)
    return process


def honest_clients(pipe_dir: Path, count: int, rounds: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-m", "tests.arbiter._client", "mixed", str(pipe_dir), str(seed),
                              str(rounds)], cwd=ROOT, stdout=subprocess.PIPE, text=True) for seed in range(count)]


def descriptors(pipe_dir: Path, total: int) -> dict:
    tally = {"pushed": 0, "answered": 0, "twice": 0, "missing": 0}
    chunk, seed = 100_000, 0
    while tally["pushed"] < total:
        run = subprocess.run([sys.executable, "-m", "tests.arbiter._descriptor_fuzz", str(pipe_dir), str(seed),
                              str(min(chunk, total - tally["pushed"]))], cwd=ROOT, capture_output=True, text=True)
        if run.returncode:
            tally["fuzzer_failures"] = tally.get("fuzzer_failures", 0) + 1
            print(run.stderr[-1000:], file=sys.stderr)
            break
        result = json.loads(run.stdout)
        for key in tally:
            tally[key] += result.get(key, 0)
        seed += 1
        progress("descriptors", tally["pushed"], total)
    return tally


def control_messages(pipe_dir: Path, total: int) -> dict:
    """Seeded hostile session requests, control commands and hellos (the generators of
    tests/arbiter/test_connection_attacks.py); every one must get an error reply."""
    import random

    from tests.arbiter import test_connection_attacks as attacks

    rng = random.Random(1)
    session, operator, hello = attacks.session_raw(pipe_dir), attacks.connect_raw(pipe_dir), None
    tally = {"sent": 0, "refused": 0, "unanswered": 0, "accepted": 0}
    try:
        for i in range(total):
            kind = i % 3
            if kind == 2 and (hello is None or i % 1500 == 2):  # a connection has 10 s to say hello
                if hello is not None:
                    hello.close()
                hello = attacks.connect_raw(pipe_dir)
            sock = (session, operator, hello)[kind]
            message = (attacks.hostile_session_request, attacks.hostile_control, attacks.hostile_hello)[kind](rng)
            tally["sent"] += 1
            try:
                attacks.send_hostile(sock, message)
                answer = attacks.reply(sock)
            except (OSError, EOFError, ValueError):
                tally["unanswered"] += 1
                break
            tally["refused" if answer.get("ok") is False else "accepted"] += 1
            if i % 1000 == 999:
                progress("control messages", i + 1, total)
    finally:
        for sock in (session, operator, hello):
            if sock is not None:
                sock.close()
    return tally


def kill_storm(pipe_dir: Path, total: int, parallel: int) -> dict:
    rng = random.Random(1)
    started = killed = 0
    running: list[tuple[subprocess.Popen, float]] = []
    while killed < total:
        while started < total and len(running) < parallel:
            victim = subprocess.Popen([sys.executable, "-c", _VICTIM, str(pipe_dir)], cwd=ROOT,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            running.append((victim, time.monotonic() + rng.uniform(0.05, 1.5)))
            started += 1
        now = time.monotonic()
        for victim, at in [entry for entry in running if entry[1] <= now]:
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            running.remove((victim, at))
            killed += 1
            progress("kill storm", killed, total)
        time.sleep(0.01)
    return {"killed": killed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--descriptors", type=int, default=1_000_000)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--kills", type=int, default=1000)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--arbiter-root", type=Path, default=ROOT,
                        help="run the arbiter of another checkout (with its ring built), for a before/after")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pipe_dir = Path(tmp) / "pipe"
        arbiter = start_arbiter(pipe_dir, args.arbiter_root)
        try:
            warm = honest_clients(pipe_dir, 1, 2)
            warm[0].communicate()
            before = census(arbiter.pid)
            honest = honest_clients(pipe_dir, 2, 10**6)
            report = {"before": before, "descriptors": descriptors(pipe_dir, args.descriptors),
                      "control_messages": control_messages(pipe_dir, args.messages),
                      "kill_storm": kill_storm(pipe_dir, args.kills, args.parallel)}
            for client in honest:
                client.kill()
                client.wait()
            report["honest_failures"] = sum(client.returncode not in (0, -signal.SIGKILL) for client in honest)
            time.sleep(2)  # reclaiming the last victims: a census, not a synchronisation
            report["after"] = census(arbiter.pid)
            report["arbiter_alive"] = arbiter.poll() is None
        finally:
            arbiter.terminate()
            arbiter.wait(30)
    print(json.dumps(report, indent=2))
    return 0 if report["arbiter_alive"] else 1


if __name__ == "__main__":
    sys.exit(main())
