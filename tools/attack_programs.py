"""The long version of tests/arbiter/test_program_isolation.py: a hostile client against a daemon arbiter.

    python tools/attack_programs.py --mutants 5000 --loads 10000 --hoard 5000 --claim-gib 8 --memory-gib 4

starts ``python -m libshare.arbiter`` on a temporary pipe directory (lavapipe unless
LIBSHARE_DEVICE says otherwise), starts an honest client process that does saxpy round
trips checked against numpy for the whole run, and then, as a hostile client:

1. **mutants**: loads ``--mutants`` mutated shipped shaders (``Mutator(--seed)``, the
   same mutants as the tests' for the same seed and index), freeing what loads;
2. **loads**: loads and frees ``--loads`` distinct valid modules (saxpy with a distinct
   ``OpString``: a new compile each time, the arbiter's memory growth per pipeline);
3. **hoard**: loads up to ``--hoard`` distinct modules without freeing them (stops at the
   first QuotaExceeded), then disconnects;
4. **memory**: claims ``--memory-chunk-mib`` device buffers until the arbiter refuses one
   or ``--claim-gib`` are held, writes every byte of the first ``--memory-gib`` of them
   through a copy, and asks for one 1 TiB device buffer and one 64 GiB shared buffer.
   (An unwritten buffer costs lavapipe nothing, unless the arbiter zero-fills new
   buffers: then all it grants becomes resident. Keep ``--claim-gib`` below what the
   machine can spare.)

Then, with ``--framing ROUNDS`` and ``--evasion TRIES`` (0 skips either), on a second arbiter
(a 1 s watchdog, ``--shutdown-timeout 2``) whose honest client comes through a share socket
(a tenant of its own):

5. **framing**: each round a new process of the share socket ``hostile`` runs the shipped
   busy.spv with its own inputs past the watchdog, which ends the arbiter (lavapipe cannot
   abort it); then a client of another tenant (this tool's uid) loads busy.spv and checks a
   short dispatch: was the kernel refused to it?
6. **evasion**: each try a new process of the share socket ``hostile`` loads a slow-compiling
   kernel with one debug word changed, and the arbiter is SIGKILLed while it compiles it (the
   "driver crash"): how many tries end an arbiter before the tenant is refused? (This tool's
   uid is the operator's, which earns no tenant cooldown.)

``--phases`` picks the phases to run (default all).

When the arbiter dies it is counted (with the mutant or phase that killed it) and
restarted on the same pipe directory; both clients reconnect. At the end it prints the
deaths, the honest client's longest round trip (its "stall") and how many of its results
were wrong, and the arbiter's resident memory (VmRSS of /proc/PID/status) before and after
each phase. A progress line goes to stderr while it runs. ``--json FILE`` also writes the
figures as JSON. Exit status 1 when the arbiter died or an honest result was wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import libshare  # noqa: E402
from libshare.protocol import control as _control  # noqa: E402
from tests.arbiter import _spirv_attacks as attacks  # noqa: E402
from libshare.workloads import busy_reference  # noqa: E402
from tests.arbiter.test_quarantine import one_word_changed, slow_compile  # noqa: E402

MIB = 1 << 20


# ------------------------------------------------------------------ the arbiter

class Arbiter:
    """A daemon arbiter on ``pipe_dir`` that can be restarted; counts its deaths."""

    def __init__(self, pipe_dir: Path, env: dict[str, str], options: tuple[str, ...] = ()):
        self.pipe_dir = pipe_dir
        self.env = {**os.environ, **env}
        self.options = options
        self.stderr_path = pipe_dir.parent / f"{pipe_dir.name}.stderr"
        self.process: subprocess.Popen | None = None
        self.deaths: list[dict] = []
        self.generation = 0
        self.lock = threading.Lock()

    def start(self) -> None:
        with open(self.stderr_path, "a") as stderr:  # a file: a full pipe would stall the arbiter
            self.process = subprocess.Popen(
                [sys.executable, "-m", "libshare.arbiter", "--pipe-directory", str(self.pipe_dir), *self.options],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr, env=self.env)
        deadline = time.monotonic() + 60
        while not (self.pipe_dir / "control").exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the arbiter did not start: {self.stderr_tail()}")
            time.sleep(0.05)
        self.generation += 1

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check(self, cause: str) -> bool:
        """True (and restart it, counting the death) when the arbiter has died; ``cause`` says what ran."""
        with self.lock:
            if self.alive():
                try:
                    self.process.wait(timeout=2)  # a closed connection: give a dying process time to exit
                except subprocess.TimeoutExpired:
                    return False
            code = self.process.returncode
            self.deaths.append({"cause": cause, "exit": code, "signal": -code if code < 0 else None,
                                "stderr": self.stderr_tail(800)})
            self.start()
            return True

    def rss_mib(self, field: str = "VmRSS") -> float | None:
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None

    def children(self) -> int:
        try:
            return sum(len(Path(f"/proc/{self.process.pid}/task/{task}/children").read_text().split())
                       for task in os.listdir(f"/proc/{self.process.pid}/task"))
        except OSError:
            return 0

    def stderr_tail(self, size: int = 3000) -> str:
        try:
            return self.stderr_path.read_text()[-size:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# ------------------------------------------------------------------ the honest client (a process of its own)

def honest_main(pipe_dir: str, report_every: float) -> None:
    """Round trips until stdin closes; every ``report_every`` s prints a JSON line of its figures."""
    figures = {"round_trips": 0, "wrong": 0, "lost": 0, "max_round_trip": 0.0, "outage": 0.0,
               "round_trips_over_1s": 0, "last_error": "", "interval_max": 0.0}
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    rng = np.random.default_rng(0)
    n = 4096
    last_report = time.monotonic()
    while not stop.is_set():
        try:
            session = libshare.connect(name="honest", mode="daemon", pipe_directory=pipe_dir, timeout=30)
        except libshare.LibshareError as exc:
            figures["last_error"] = f"connect: {type(exc).__name__}: {exc}"
            time.sleep(0.2)
            continue
        try:
            program = session.load_program(libshare.shaders.path("saxpy"))
            xs, ys = session.array(n), session.array(n)
            while not stop.is_set():
                x = rng.standard_normal(n).astype(np.float32)
                y = rng.standard_normal(n).astype(np.float32)
                a = np.float32(rng.uniform(-4, 4))
                xs[:], ys[:] = x, y
                started = time.monotonic()
                session.dispatch(program, n // 64, [xs, ys], struct.pack("If", n, a)).wait(600)
                took = time.monotonic() - started
                figures["round_trips"] += 1
                figures["max_round_trip"] = max(figures["max_round_trip"], took)
                figures["interval_max"] = max(figures["interval_max"], took)
                figures["round_trips_over_1s"] += took > 1.0
                if not np.allclose(ys, a * x + y, rtol=1e-5, atol=1e-5):
                    figures["wrong"] += 1
                if time.monotonic() - last_report > report_every:
                    print(json.dumps(figures), flush=True)
                    figures["interval_max"] = 0.0
                    last_report = time.monotonic()
        except libshare.LibshareError as exc:  # the arbiter died: reconnect to its successor
            figures["lost"] += 1
            figures["last_error"] = f"{type(exc).__name__}: {exc}"
            lost_at = time.monotonic()
            while not stop.is_set():
                try:
                    libshare.connect(mode="daemon", pipe_directory=pipe_dir, timeout=1).close()
                    break
                except libshare.LibshareError:
                    time.sleep(0.1)
            figures["outage"] += time.monotonic() - lost_at
        finally:
            try:
                session.close()
            except Exception:  # noqa: BLE001 - the session of a dead arbiter may fail to close in many ways
                pass
    print(json.dumps(figures), flush=True)


class HonestProcess:
    def __init__(self, pipe_dir: Path):
        self.process = subprocess.Popen([sys.executable, __file__, "--honest", str(pipe_dir)], cwd=ROOT,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.figures: dict = {}
        self.phase = "start"
        self.phase_max: dict[str, float] = {}
        """Longest round trip reported while each phase ran (a report can straddle two phases)."""
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                self.figures = json.loads(line)
            except ValueError:
                continue
            longest = self.figures.get("interval_max", 0.0)
            self.phase_max[self.phase] = max(self.phase_max.get(self.phase, 0.0), longest)

    def wait_started(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not self.figures.get("round_trips"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the honest client did not start its round trips")
            time.sleep(0.05)

    def finish(self) -> dict:
        self.process.stdin.close()
        self.process.wait(timeout=600)
        self.reader.join(timeout=10)
        return self.figures


# ------------------------------------------------------------------ the hostile client

class Hostile:
    """The attacking session; reconnects when the arbiter died."""

    def __init__(self, arbiter: Arbiter, progress: Progress):
        self.arbiter = arbiter
        self.progress = progress
        self.session: libshare.Session | None = None
        self.generation = -1

    def connect(self) -> libshare.Session:
        if self.session is None or self.generation != self.arbiter.generation:
            if self.session is not None:
                try:
                    self.session.close()
                except Exception:  # noqa: BLE001 - the old arbiter is gone
                    pass
            self.session = libshare.connect(name="hostile", mode="daemon", pipe_directory=self.arbiter.pipe_dir,
                                            timeout=30)
            self.generation = self.arbiter.generation
        return self.session

    def attempt(self, cause: str, action) -> tuple[str, object]:
        """Run ``action(session)``: ("ok", value), (error class name, error), or ("death", None)."""
        try:
            session = self.connect()
            value = action(session)
        except (libshare.ArbiterLost, libshare.ProtocolError, OSError, EOFError) as exc:
            if self.arbiter.check(cause):  # a lost connection: did the arbiter die of it?
                self.progress.note(f"ARBITER DIED during {cause}; restarted")
                return "death", None
            return type(exc).__name__, exc
        except libshare.LibshareError as exc:
            outcome: tuple[str, object] = (type(exc).__name__, exc)
        else:
            outcome = ("ok", value)
        if not self.arbiter.alive() and self.arbiter.check(cause):  # answered, then died
            self.progress.note(f"ARBITER DIED right after {cause}; restarted")
            return "death", None
        return outcome

    def close(self) -> None:
        if self.session is not None:
            try:
                self.session.close()
            except Exception:  # noqa: BLE001
                pass
            self.session = None


class Progress:
    def __init__(self, arbiter: Arbiter, honest: HonestProcess):
        self.arbiter, self.honest = arbiter, honest
        self.phase, self.done, self.total, self.counts = "", 0, 0, Counter()
        self.last = 0.0
        self.tty = sys.stderr.isatty()

    def set(self, phase: str, total: int) -> None:
        self.phase, self.done, self.total, self.counts = phase, 0, total, Counter()

    def step(self, outcome: str) -> None:
        self.done += 1
        self.counts[outcome] += 1
        now = time.monotonic()
        if now - self.last > (0.5 if self.tty else 10.0) or self.done == self.total:
            self.last = now
            self.show()

    def show(self) -> None:
        honest = self.honest.figures
        counts = " ".join(f"{k} {v}" for k, v in self.counts.most_common())
        line = (f"[{self.phase} {self.done}/{self.total}] {counts} | deaths {len(self.arbiter.deaths)} | "
                f"honest {honest.get('round_trips', 0)} rt, max {honest.get('max_round_trip', 0):.2f} s, "
                f"wrong {honest.get('wrong', 0)} | arbiter rss {self.arbiter.rss_mib() or 0:.0f} MiB, "
                f"children {self.arbiter.children()}")
        if self.tty:
            sys.stderr.write("\r" + line[:shutil.get_terminal_size().columns - 1].ljust(60))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def note(self, text: str) -> None:
        sys.stderr.write(("\n" if self.tty else "") + text + "\n")
        sys.stderr.flush()


# ------------------------------------------------------------------ phases

def phase_mutants(hostile: Hostile, progress: Progress, count: int, seed: int, dispatch: bool, first: int = 0) -> dict:
    mutator = attacks.Mutator(seed)
    progress.set("mutants", count)
    killers, odd = [], []
    started = time.monotonic()
    for index, description, module in mutator.mutants(count, start=first):
        outcome, value = hostile.attempt(f"mutant {index} of seed {seed} ({description})",
                                         lambda session: session.load_program(module))
        if outcome == "ok":
            if dispatch:
                _dispatch_once(hostile, value, f"first dispatch of mutant {index} ({description})")
            hostile.attempt("free", lambda session: session.free(value))
            outcome = "loaded"
        elif outcome == "death":
            killers.append({"index": index, "description": description})
        elif outcome != "InvalidSubmission":
            odd.append({"index": index, "description": description, "error": f"{outcome}: {value}"})
        progress.step(outcome)
    return {"seed": seed, "first": first, "count": count, "outcomes": dict(progress.counts), "killers": killers,
            "not_invalid_submission": odd[:50], "seconds": round(time.monotonic() - started, 1)}


def _dispatch_once(hostile: Hostile, program, cause: str) -> None:
    def run(session):
        buffers = [session.array(1 << 12) for _ in range(program.bindings)]
        push = struct.pack("If", 1 << 12, 0.5)[:program.push_size].ljust(program.push_size, b"\0")
        session.dispatch(program, 1, buffers, push).wait(120)
    hostile.attempt(cause, run)


def phase_loads(hostile: Hostile, progress: Progress, arbiter: Arbiter, count: int) -> dict:
    saxpy = attacks.shipped("saxpy")
    progress.set("loads", count)
    before, started, generation = arbiter.rss_mib(), time.monotonic(), arbiter.generation
    for n in range(count):
        module = attacks.distinct(saxpy, 1_000_000 + n)

        def load_free(session):
            session.free(session.load_program(module))
        outcome, _ = hostile.attempt(f"load/free {n} of distinct modules", load_free)
        progress.step("ok" if outcome == "ok" else outcome)
    seconds = time.monotonic() - started
    after = arbiter.rss_mib()
    same = generation == arbiter.generation  # RSS figures of one process only
    return {"count": count, "outcomes": dict(progress.counts), "rss_mib_before": before, "rss_mib_after": after,
            "kib_per_load": round((after - before) * 1024 / max(count, 1), 1) if same and before and after else None,
            "loads_per_second": round(count / max(seconds, 1e-9), 1), "restarted": not same}


def phase_hoard(hostile: Hostile, progress: Progress, arbiter: Arbiter, count: int) -> dict:
    saxpy = attacks.shipped("saxpy")
    progress.set("hoard", count)
    before = arbiter.rss_mib()
    held, refusal = 0, None
    for n in range(count):
        module = attacks.distinct(saxpy, 2_000_000 + n)
        outcome, value = hostile.attempt(f"hoarding distinct module {n}", lambda session: session.load_program(module))
        progress.step(outcome)
        if outcome == "ok":
            held += 1
        elif outcome == "QuotaExceeded":
            refusal = str(value)
            break
    peak = arbiter.rss_mib()
    left = time.monotonic()
    hostile.close()  # the arbiter reclaims everything the client held
    settle = time.monotonic() + 30
    while time.monotonic() < settle and _clients(arbiter) > 1:
        time.sleep(0.1)
    _probe(arbiter)  # a round trip through the drain thread, after the reclaim
    return {"asked": count, "held": held, "quota_exceeded": refusal, "rss_mib_before": before,
            "rss_mib_holding": peak, "rss_mib_after_disconnect": arbiter.rss_mib(),
            "seconds_to_reclaim": round(time.monotonic() - left, 2)}


def _probe(arbiter: Arbiter) -> None:
    """One saxpy round trip of a fresh client (the drain thread has served what was queued before it)."""
    try:
        with libshare.connect(name="probe", mode="daemon", pipe_directory=arbiter.pipe_dir, timeout=30) as session:
            program = session.load_program(libshare.shaders.path("saxpy"))
            x = session.array(64)
            session.dispatch(program, 1, [x, x], struct.pack("If", 64, 1.0)).wait(600)
    except libshare.LibshareError:
        pass


def _clients(arbiter: Arbiter) -> int:
    try:
        with libshare.connect(mode="daemon", pipe_directory=arbiter.pipe_dir, timeout=5) as session:
            return session.stats()["clients"] - 1
    except libshare.LibshareError:
        return 0


def phase_memory(hostile: Hostile, progress: Progress, arbiter: Arbiter, claim_gib: float, touch_gib: float,
                 chunk_mib: int) -> dict:
    """Claim device buffers until refused (or ``claim_gib``), write every byte of the first
    ``touch_gib`` of them, then ask for 1 TiB device and 64 GiB shared in one buffer each."""
    chunks = int(claim_gib * 1024 // chunk_mib)
    touch = int(touch_gib * 1024 // chunk_mib)
    progress.set("memory", chunks + 2)
    before, claimed, touched, refusal = arbiter.rss_mib(), 0, 0, None
    peak = before or 0.0
    source = None
    for i in range(chunks):
        def claim(session, write=i < touch):
            nonlocal source
            buffer = session.alloc(chunk_mib * MIB, kind="device")
            if write:  # lavapipe's device memory is the arbiter's heap: written, it is resident
                if source is None:
                    source = session.alloc(chunk_mib * MIB)
                    source.array((chunk_mib * MIB,), np.uint8)[:] = 0xA5
                session.copy(source, buffer).wait(600)
            return buffer
        outcome, value = hostile.attempt(f"claiming device buffer {i} of {chunk_mib} MiB", claim)
        progress.step(outcome)
        if outcome != "ok":
            refusal = f"{outcome}: {value}"
            break
        claimed += chunk_mib
        touched += chunk_mib if i < touch else 0
        peak = max(peak, arbiter.rss_mib() or 0.0)
    outcome, value = hostile.attempt("allocating 1 TiB", lambda session: session.alloc(1 << 40, kind="device"))
    progress.step(outcome)
    huge = "granted" if outcome == "ok" else f"{outcome}: {value}"
    outcome, value = hostile.attempt("allocating 64 GiB shared", lambda session: session.alloc(64 << 30))
    progress.step(outcome)
    huge_shared = "granted" if outcome == "ok" else f"{outcome}: {value}"
    oom = {}
    for name, pid in (("arbiter", arbiter.process.pid), ("attacker", os.getpid())):
        try:
            oom[name] = int(Path(f"/proc/{pid}/oom_score").read_text())
        except OSError:
            oom[name] = None
    hostile.close()
    settle = time.monotonic() + 30
    while time.monotonic() < settle and _clients(arbiter) > 1:
        time.sleep(0.1)
    _probe(arbiter)
    return {"claim_limit_mib": chunks * chunk_mib, "claimed_mib": claimed, "written_mib": touched,
            "first_refusal": refusal, "one_tib_device": huge, "sixty_four_gib_shared": huge_shared,
            "rss_mib_before": before, "rss_mib_peak": peak, "rss_mib_after_free": arbiter.rss_mib(),
            "oom_score_while_holding": oom}


# ------------------------------------------------------------------ tenancy: framing and evasion

def _serving(arbiter: Arbiter, shares: tuple[str, ...]) -> None:
    """Wait until the (re)started arbiter answers, then open ``shares`` (a new arbiter opens none)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            if _control.run("get_server_list", pipe_directory=arbiter.pipe_dir) == str(arbiter.process.pid):
                break
        except libshare.LibshareError:
            pass
        if time.monotonic() > deadline or not arbiter.alive():
            raise SystemExit(f"the arbiter does not answer: {arbiter.stderr_tail()}")
        time.sleep(0.05)
    for group in shares:
        _control.run("open_share", group, pipe_directory=arbiter.pipe_dir)


def runaway_main(pipe_dir: str) -> None:
    """A child process: busy.spv for hours with its own inputs; prints how it ended."""
    try:
        with libshare.connect(name="runaway", mode="daemon", pipe_directory=pipe_dir, reattach=False) as session:
            program = session.load_program(libshare.shaders.path("busy"))
            data = session.array(65535 * 64, np.uint32)
            session.dispatch(program, (65535, 64, 1), [data], struct.pack("II", 65535 * 64, 1_000_000)).wait(600)
        print("finished", flush=True)
    except libshare.LibshareError as exc:
        print(type(exc).__name__, flush=True)


def _child(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, *args], cwd=ROOT, stdout=subprocess.PIPE, text=True)


def phase_framing(arbiter: Arbiter, shares: tuple[str, ...], rounds: int) -> dict:
    hostile_dir = arbiter.pipe_dir / "shares" / "hostile"
    outcomes, blamed, attempts = Counter(), 0, 0
    while blamed < rounds and attempts < 3 * rounds:  # a round shared with the honest client's work blames nobody
        attempts += 1
        runaway = _child("--runaway", str(hostile_dir))
        outcome = runaway.stdout.readline().strip()
        runaway.wait(timeout=120)
        runaway.stdout.close()
        outcomes[outcome] += 1
        blamed += bool(_journaled(arbiter, runaway.pid, "program"))
        if arbiter.check("framing: busy.spv past the watchdog"):
            _serving(arbiter, shares)
    try:  # another tenant: this tool's uid, through the arbiter's own socket
        with libshare.connect(name="other-tenant", mode="daemon", pipe_directory=arbiter.pipe_dir) as session:
            program = session.load_program(libshare.shaders.path("busy"))
            data = session.array(4096, np.uint32)
            session.dispatch(program, 64, [data], struct.pack("II", 4096, 100)).wait(60)
            other = "loaded and ran right" if np.array_equal(data, busy_reference(4096, 100)) else "WRONG results"
    except libshare.LibshareError as exc:
        other = f"{type(exc).__name__}: {str(exc)[:120]}"
    return {"rounds": attempts, "blamed": blamed, "runaway_outcomes": dict(outcomes), "busy_for_another_tenant": other}


def phase_evasion(arbiter: Arbiter, shares: tuple[str, ...], tries: int, workdir: Path) -> dict:
    module = slow_compile(workdir)
    refusals, deaths, outcomes = Counter(), 0, Counter()
    for n in range(tries):
        path = workdir / f"evade{n}.spv"
        path.write_bytes(one_word_changed(module, n))
        evader = subprocess.Popen([sys.executable, "-m", "tests.arbiter._client", "load",
                                   str(arbiter.pipe_dir / "shares" / "hostile"), str(path)],  # the hostile tenant
                                  cwd=ROOT, stdout=subprocess.PIPE, text=True)
        first = evader.stdout.readline().strip()
        first = first.split()[1].rstrip(":") if first.startswith("refused ") else first
        if first == "connected":
            while evader.poll() is None and not _journaled(arbiter, evader.pid):
                time.sleep(0.02)
            if evader.poll() is None:  # the "driver crash", in the middle of the arbiter's own compile
                arbiter.process.kill()
                deaths += arbiter.check(f"evasion try {n}: a compile crash")
                _serving(arbiter, shares)
            first = evader.stdout.readline().strip() or "lost"
        evader.wait(timeout=120)
        evader.stdout.close()
        outcomes[first] += 1
        if first in ("Quarantined", "AccessDenied"):
            refusals[first] += 1
    return {"tries": tries, "outcomes": dict(outcomes), "refusals": sum(refusals.values()), "deaths": deaths}


def _journaled(arbiter: Arbiter, pid: int, naming: str = "client") -> bool:
    """Whether the arbiter's journal holds a record of process ``pid`` (with a ``naming`` field set)."""
    for record in (arbiter.pipe_dir / "quarantine").glob("action-*"):
        try:
            fields = json.loads(record.read_text())
            if fields["client"]["pid"] == pid and fields.get(naming):
                return True
        except (OSError, ValueError, KeyError):
            continue
    return False


def run_tenancy(args, workdir: Path, report: dict) -> None:
    """The framing and evasion phases, on an arbiter of their own with the honest client as a tenant."""
    shares = ("honest", "hostile")
    arbiter = Arbiter(workdir / "tenancy", {"LIBSHARE_WATCHDOG_SECONDS": "1", "LIBSHARE_COMPILE_TIMEOUT": "300"},
                      ("--shutdown-timeout", "2"))
    arbiter.start()
    _serving(arbiter, shares)
    honest = HonestProcess(arbiter.pipe_dir / "shares" / "honest")
    try:
        honest.wait_started()
        for name, count, run in (("framing", args.framing, lambda: phase_framing(arbiter, shares, args.framing)),
                                 ("evasion", args.evasion, lambda: phase_evasion(arbiter, shares, args.evasion,
                                                                                   workdir))):
            if count and name in args.phases:
                lost, deaths = honest.figures.get("lost", 0), len(arbiter.deaths)
                result = run()
                wait_until_reported(honest)
                result["arbiter_deaths"] = len(arbiter.deaths) - deaths
                result["honest_sessions_lost"] = honest.figures.get("lost", 0) - lost
                report["phases"][name] = result
    finally:
        figures = honest.finish()
        report["tenancy_honest"] = {k: figures.get(k) for k in ("round_trips", "wrong", "lost")}
        report["deaths"].extend(arbiter.deaths)
        arbiter.stop()


def wait_until_reported(honest: HonestProcess, timeout: float = 60) -> None:
    """Until the honest client has made a round trip since now (its figures then count what came before)."""
    done, deadline = honest.figures.get("round_trips", 0), time.monotonic() + timeout
    while honest.figures.get("round_trips", 0) <= done and time.monotonic() < deadline:
        time.sleep(0.1)


# ------------------------------------------------------------------ main

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mutants", type=int, default=5000, help="mutated shipped shaders to load (default 5000)")
    parser.add_argument("--seed", type=int, default=11, help="mutation seed (default 11, the tests' seed)")
    parser.add_argument("--first-mutant", type=int, default=0, help="index of the first mutant (to replay a range)")
    parser.add_argument("--dispatch-accepted", action="store_true",
                        help="dispatch every mutant that loads once (llvmpipe compiles at the first dispatch)")
    parser.add_argument("--loads", type=int, default=10000, help="distinct modules to load and free (default 10000)")
    parser.add_argument("--hoard", type=int, default=5000,
                        help="distinct modules to load without freeing, up to the first refusal (default 5000)")
    parser.add_argument("--memory-gib", type=float, default=4.0,
                        help="device memory to write for real, in GiB (default 4; mind the machine's others)")
    parser.add_argument("--claim-gib", type=float, default=8.0,
                        help="device memory to claim until refused (default 8). Mind the machine: an arbiter that "
                             "zero-fills new device buffers becomes resident for all it grants, up to its limit "
                             "(3/4 of the memory available), even for buffers the client never writes")
    parser.add_argument("--memory-chunk-mib", type=int, default=256, help="size of each buffer (default 256 MiB)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (arbiter.stderr, logs)")
    parser.add_argument("--framing", type=int, default=2, help="rounds of busy.spv past the watchdog (default 2)")
    parser.add_argument("--evasion", type=int, default=5, help="new processes crashing a compile (default 5)")
    parser.add_argument("--phases", default="mutants,loads,hoard,memory,framing,evasion",
                        help="the phases to run, comma-separated (default all)")
    parser.add_argument("--honest", help=argparse.SUPPRESS)
    parser.add_argument("--runaway", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.phases = args.phases.split(",")
    if args.honest or args.runaway:
        honest_main(args.honest, 0.5) if args.honest else runaway_main(args.runaway)
        return 0

    workdir = Path(tempfile.mkdtemp(prefix="attack_programs."))
    pipe_dir = workdir / "pipe"
    arbiter = Arbiter(pipe_dir, {})
    arbiter.start()
    honest = HonestProcess(pipe_dir)
    report: dict = {"device": None, "phases": {}}
    try:
        honest.wait_started()
        with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as probe:
            report["device"] = probe.device_name
        report["rss_mib_start"] = arbiter.rss_mib()
        progress = Progress(arbiter, honest)
        hostile = Hostile(arbiter, progress)
        sys.stderr.write(f"arbiter pid {arbiter.process.pid} on {report['device']}, pipe directory {pipe_dir}\n")
        phases = [("mutants", lambda: phase_mutants(hostile, progress, args.mutants, args.seed, args.dispatch_accepted,
                                                     args.first_mutant)),
                  ("loads", lambda: phase_loads(hostile, progress, arbiter, args.loads)),
                  ("hoard", lambda: phase_hoard(hostile, progress, arbiter, args.hoard)),
                  ("memory", lambda: phase_memory(hostile, progress, arbiter, args.claim_gib, args.memory_gib,
                                                   args.memory_chunk_mib))]
        for name, run in [(name, run) for name, run in phases if name in args.phases]:
            honest.phase = name
            deaths_before, started = len(arbiter.deaths), time.monotonic()
            result = run()
            result["deaths"] = len(arbiter.deaths) - deaths_before
            result["seconds"] = round(time.monotonic() - started, 1)
            result["arbiter_pid"] = arbiter.process.pid
            honest.phase = f"after {name}"
            if result["deaths"]:
                result["note"] = "the arbiter was restarted during this phase: its RSS figures span two processes"
            report["phases"][name] = result
            progress.note("")
        hostile.close()
        report["rss_mib_end"] = arbiter.rss_mib()
        report["vm_hwm_mib_end"] = arbiter.rss_mib("VmHWM")
    finally:
        report["honest"] = honest.finish()
        report["honest_longest_round_trip_by_phase"] = {k: round(v, 3) for k, v in honest.phase_max.items()}
        report["deaths"] = arbiter.deaths
        report["arbiter_alive_at_end"] = arbiter.alive()
        arbiter.stop()
    try:
        if {"framing", "evasion"} & set(args.phases):
            run_tenancy(args, workdir, report)
    finally:
        if args.keep:
            sys.stderr.write(f"kept {workdir}\n")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 1 if report["deaths"] or report["honest"].get("wrong") else 0


def print_report(report: dict) -> None:
    phases, honest = report["phases"], report["honest"]
    print(f"device: {report['device']}")
    print(f"arbiter deaths: {len(report['deaths'])} (each restarted)")
    for death in report["deaths"]:
        print(f"  exit {death['exit']} during {death['cause']}")
    print(f"honest client: {honest.get('round_trips')} round trips, longest {honest.get('max_round_trip', 0):.3f} s, "
          f"{honest.get('round_trips_over_1s')} over 1 s, {honest.get('wrong')} wrong, "
          f"sessions lost {honest.get('lost')}, {honest.get('outage', 0):.1f} s without an arbiter")
    print("  longest honest round trip while each phase ran: "
          + ", ".join(f"{k} {v:.3f} s" for k, v in report["honest_longest_round_trip_by_phase"].items()))
    print(f"arbiter RSS: {report.get('rss_mib_start') or 0:.0f} MiB at the start, "
          f"{report.get('rss_mib_end') or 0:.0f} MiB at the end (VmHWM {report.get('vm_hwm_mib_end') or 0:.0f} MiB)"
          + (" -- of a restarted arbiter" if report["deaths"] else ""))
    if "mutants" in phases:
        m = phases["mutants"]
        print(f"mutants (seed {m['seed']}): {m['outcomes']} in {m['seconds']} s; killers: "
              f"{[k['index'] for k in m['killers']]}; not InvalidSubmission: {len(m['not_invalid_submission'])}")
        for odd in m["not_invalid_submission"][:5]:
            print(f"  mutant {odd['index']} ({odd['description']}): {odd['error'][:160]}")
    if "loads" in phases:
        p = phases["loads"]
        print(f"loads: {p['count']} distinct load/free {p['outcomes']}, {p['loads_per_second']}/s; arbiter RSS "
              f"{p['rss_mib_before'] or 0:.0f} -> {p['rss_mib_after'] or 0:.0f} MiB "
              + ("(not comparable: the arbiter was restarted meanwhile)" if p["restarted"]
                 else f"({p['kib_per_load']} KiB a load)"))
    if "hoard" in phases:
        p = phases["hoard"]
        print(f"hoard: held {p['held']} of {p['asked']} distinct programs; refusal: {p['quota_exceeded']}; "
              f"arbiter RSS {p['rss_mib_before'] or 0:.0f} -> {p['rss_mib_holding'] or 0:.0f} MiB holding, "
              f"{p['rss_mib_after_disconnect'] or 0:.0f} MiB after the client left (reclaimed in "
              f"{p['seconds_to_reclaim']} s)")
    if "framing" in phases:
        p = phases["framing"]
        print(f"framing: {p['rounds']} rounds of busy.spv past the watchdog by one tenant ({p['blamed']} alone in its "
              f"submission, so blamed) {p['runaway_outcomes']}, "
              f"{p['arbiter_deaths']} arbiter deaths, honest sessions lost {p['honest_sessions_lost']}; busy.spv for "
              f"another tenant: {p['busy_for_another_tenant']}")
    if "evasion" in phases:
        p = phases["evasion"]
        print(f"evasion: {p['tries']} new processes of one tenant (share socket), each with one debug word changed: {p['deaths']} "
              f"arbiter deaths, {p['refusals']} refusals {p['outcomes']}, honest sessions lost "
              f"{p['honest_sessions_lost']}")
    if "tenancy_honest" in report:
        print(f"honest tenant (share socket) in framing and evasion: {report['tenancy_honest']}")
    if "memory" in phases:
        p = phases["memory"]
        print(f"memory: claimed {p['claimed_mib']} MiB of device buffers (of {p['claim_limit_mib']} tried), wrote "
              f"{p['written_mib']} MiB of them; first refusal: {(p['first_refusal'] or 'none')[:140]}")
        print(f"  one 1 TiB device buffer: {p['one_tib_device'][:120]}")
        print(f"  one 64 GiB shared buffer: {p['sixty_four_gib_shared'][:120]}")
        print(f"  arbiter RSS {p['rss_mib_before'] or 0:.0f} -> peak {p['rss_mib_peak'] or 0:.0f} -> "
              f"{p['rss_mib_after_free'] or 0:.0f} MiB after the client left; oom_score while it held them "
              f"{p['oom_score_while_holding']}")


if __name__ == "__main__":
    sys.exit(main())
