"""The long containment run: runaways, a restart under a long dispatch, a burst of deaths, adoption.

Run from the repository root (each phase takes a minute or two on lavapipe)::

    .venv/bin/python tools/attack_containment.py --phases runaway,restart,burst,adopt

and, for a before/after, with another checkout (its cffi modules built) first on the path::

    PYTHONPATH=/tmp/before .venv/bin/python tools/attack_containment.py

Every process it starts (the control daemon ``libshare-control -d``, and through it the
arbiters, and the clients) imports libshare from where this process did: their
``PYTHONPATH`` names that checkout and they run in a temporary directory, so that
``python -m`` does not find the working tree first. The report says which code ran
(``libshare``: this process's ``libshare.__file__``; each honest client's; each phase's
first arbiter's mapped engine module).

Phases (``--phases``, comma-separated, all by default), each on a pipe directory of its own
under a control daemon, beside an honest client (this file run as ``--honest DIR``: checked
saxpy round trips on one session, a JSON line a second with its counts and longest pause):

* ``runaway``: with a ``--watchdog`` second watchdog, ``--runaways`` times a client (``--runaway
  DIR``) dispatches busy.comp for hours; per runaway: the honest client's longest pause between
  two successes, its errors by class, whether it computed again on a new arbiter within 30 s of
  the runaway's error (a dead honest session is replaced for the next runaway, and the report
  says so), what the runaway's ticket and its next two calls raised, how the arbiter ended
  (control.log) and when a new one served. A runaway the quarantine refuses (busy.comp's
  strikes, or its uid's) is reported in ``refused_first``, the quarantine cleared, and tried again;
* ``restart``: fairshare scheduling, the honest client at high priority, a low-priority client
  (``--long DIR``) with one long cuttable busy dispatch (its rounds calibrated by one run to last
  about ``--long-seconds``); ``libshare-control restart`` once it runs in pieces and
  ``--restart-at`` of that is past; reports each client's errors, the honest client's worst
  pause, and whether and when the long dispatch ended with busy_reference's result;
* ``burst``: SIGKILLs every standby arbiter as it appears until control.log's back-off stops
  growing (or reaches ``--burst-ceiling``), then the active arbiter; reports the back-offs, when
  a new arbiter served, the honest client's errors (anything but ArbiterRestarted is a lost
  session) and its pause;
* ``adopt``: SIGKILLs the control daemon, runs ``libshare-control restart`` and ``libshare-control
  -d`` (rc and output of each), then SIGKILLs the serving arbiter: does the honest client compute
  again?

A pause that has not ended (the honest client never computed again) is counted up to the
moment the phase gave up waiting: read it with ``honest_computed_again...``, which is then null.
It prints a progress line per step on stderr and a JSON report on stdout; the tail of
control.log and server.log of a phase goes in the report when something went wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # last: a PYTHONPATH naming another checkout wins

RUNAWAY_N = 65535 * 64
RUNAWAY_GROUPS = (65535, 64, 1)
RUNAWAY_PUSH = struct.pack("II", RUNAWAY_N, 1_000_000)  # hours on lavapipe (tests/arbiter/test_runaway.py)
LONG_N = 1 << 16
CALIBRATION_ITERATIONS = 100_000
SAXPY_N = 4096
GAP_REPORTED = 0.25  # seconds: a pause between two honest successes longer than this is an event
RECOVERY_WAIT = 30.0  # seconds the honest client has to compute again after an attack


def say(**fields) -> None:
    """One JSON line on stdout (a child's event)."""
    print(json.dumps(fields), flush=True)


def progress(text: str) -> None:
    """The progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the child processes


def honest_main(pipe_directory: str) -> int:
    """Checked saxpy round trips on one session until stdin closes; a tick line a second, a ``gap``
    line for each pause past GAP_REPORTED, an ``error`` line for the first errors of each class."""
    import numpy as np

    import libshare

    try:
        session = libshare.connect(name="honest", mode="daemon", pipe_directory=pipe_directory)
        program = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(SAXPY_N, np.float32), session.array(SAXPY_N, np.float32)
    except Exception as exc:  # noqa: BLE001 - said, not raised: the parent reads it
        say(event="failed", error=type(exc).__name__, message=str(exc)[:300])
        return 1
    x[:] = np.arange(SAXPY_N, dtype=np.float32)
    expected = 2.0 * x + 1.0
    push = struct.pack("If", SAXPY_N, 2.0)
    say(event="ready", t=time.monotonic(), arbiter=session.arbiter_pid, libshare=libshare.__file__)
    ok, errors, longest, arbiters = 0, {}, 0.0, set()
    last_ok = last_tick = time.monotonic()
    while not select.select([sys.stdin], [], [], 0)[0]:
        y[:] = 1.0
        try:
            session.dispatch(program, SAXPY_N // 64, [x, y], push).wait(timeout=60)
            good = bool(np.array_equal(y, expected))
        except Exception as exc:  # noqa: BLE001 - every class is counted
            good, name = None, type(exc).__name__
            errors[name] = errors.get(name, 0) + 1
            if errors[name] <= 3:
                say(event="error", t=time.monotonic(), error=name, message=str(exc)[:300])
            time.sleep(0.05)
        now = time.monotonic()
        if good is False:
            errors["WrongResult"] = errors.get("WrongResult", 0) + 1
        elif good:
            if now - last_ok > GAP_REPORTED:
                say(event="gap", start=last_ok, end=now, gap=round(now - last_ok, 3), arbiter=session.arbiter_pid)
            longest, last_ok, ok = max(longest, now - last_ok), now, ok + 1
            if session.arbiter_pid not in arbiters:
                arbiters.add(session.arbiter_pid)
                say(event="ok_on", t=now, arbiter=session.arbiter_pid)
        if now - last_tick >= 1.0:
            last_tick = now
            say(event="tick", t=now, ok=ok, last_ok=last_ok, longest_gap=round(longest, 3), errors=errors,
                arbiter=session.arbiter_pid, reattached=session.reattached)
        time.sleep(0.005)  # a round trip every few ms: the machine is shared
    say(event="end", ok=ok, errors=errors, longest_gap=round(longest, 3), reattached=session.reattached)
    return 0


def _call(what: str, call) -> None:
    """Run ``call`` and say what it returned or raised."""
    try:
        call()
        say(event=what, t=time.monotonic(), error=None)
    except Exception as exc:  # noqa: BLE001 - what it raised is the figure
        say(event=what, t=time.monotonic(), error=type(exc).__name__, message=str(exc)[:300])


def runaway_main(pipe_directory: str) -> int:
    """Dispatch busy.comp for hours, wait for its ticket, then say what the next calls raise."""
    import numpy as np

    import libshare

    try:
        session = libshare.connect(name="runaway", mode="daemon", pipe_directory=pipe_directory, timeout=30)
        program = session.load_program(libshare.shaders.path("busy"))
        data = session.array(RUNAWAY_N, np.uint32)
    except Exception as exc:  # noqa: BLE001
        say(event="failed", error=type(exc).__name__, message=str(exc)[:300])
        return 1
    say(event="dispatched", t=time.monotonic(), arbiter=session.arbiter_pid)
    ticket = session.dispatch(program, groups=RUNAWAY_GROUPS, buffers=[data], push=RUNAWAY_PUSH)
    _call("ticket", lambda: ticket.wait(timeout=150))
    _call("next_call", session.stats)
    _call("second_call", lambda: session.array(16))
    _call("close", session.close)
    return 0


def long_main(pipe_directory: str, iterations: int) -> int:
    """One low-priority cuttable busy dispatch of LONG_N invocations: say when it runs in pieces,
    then when it ended, how, and whether its result is busy_reference's."""
    import numpy as np

    import libshare
    from libshare.workloads import busy_reference

    session = libshare.connect(name="long", priority="low", mode="daemon", pipe_directory=pipe_directory,
                               timeout=30)
    program = session.load_program(libshare.shaders.path("busy"))
    data = session.array(LONG_N, np.uint32)
    started = time.monotonic()
    ticket = session.dispatch(program, groups=LONG_N // 64, buffers=[data],
                              push=struct.pack("II", LONG_N, iterations))
    say(event="dispatched", t=started, arbiter=session.arbiter_pid, iterations=iterations)
    try:
        while not ticket.done() and session.stats()["pieces"] < 2:
            time.sleep(0.05)
        say(event="under_way", t=time.monotonic(), done=ticket.done())
        ticket.wait(timeout=600)
        error = None
    except Exception as exc:  # noqa: BLE001
        error = f"{type(exc).__name__}: {str(exc)[:300]}"
    ended = time.monotonic()
    correct = error is None and bool(np.array_equal(data, busy_reference(LONG_N, iterations)))
    say(event="end", t=ended, seconds=round(ended - started, 3), error=error, correct=correct,
        reattached=session.reattached, arbiter=session.arbiter_pid)
    session.close()
    return 0


# ---------------------------------------------------------------- processes seen from outside


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def alive(pid: int | None) -> bool:
    """True while ``pid`` runs (not gone, not a zombie)."""
    fields = stat_fields(pid) if pid else None
    return fields is not None and fields[0] not in ("Z", "X")


def children_of(parent: int) -> list[int]:
    """The living children of ``parent``."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = stat_fields(int(name))
            if fields is not None and int(fields[1]) == parent and fields[0] not in ("Z", "X"):
                pids.append(int(name))
    return pids


def kill(pid: int | None) -> None:
    """SIGKILL ``pid`` (one this run started, directly or through its control daemon)."""
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def engine_module(pid: int | None) -> str | None:
    """The engine's cffi module an arbiter mapped: which checkout it runs."""
    try:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            if "_engine_cffi" in line:
                return " ".join(line.split()[5:])  # its path (", (deleted)" once rebuilt under it)
    except OSError:
        pass
    return None


def wait_for(condition, timeout: float, step: float = 0.02):
    """``condition()``'s first true value within ``timeout`` seconds, else None."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value or None
        time.sleep(step)


class Child:
    """A child process of this file (``--honest``, ``--runaway``, ``--long``); its JSON lines are
    collected as they come."""

    def __init__(self, run: "Run", *args: str, **env: str):
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args], cwd=run.tmp,
                                        env=run.env(**env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True)
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                self.events.append(json.loads(line))
            except ValueError:
                self.events.append({"event": "garbage", "line": line[:200]})

    def event(self, name: str) -> dict | None:
        """The first event called ``name``."""
        return next((e for e in list(self.events) if e["event"] == name), None)

    def last(self, name: str) -> dict | None:
        """The last event called ``name``."""
        return next((e for e in reversed(list(self.events)) if e["event"] == name), None)

    def ok_after(self, moment: float) -> float | None:
        """When the honest client last succeeded, if after ``moment``."""
        tick = self.last("tick")
        return tick["last_ok"] if tick and tick["last_ok"] > moment else None

    def served_after(self, moment: float, *not_by: int | None) -> float | None:
        """When it first succeeded on an arbiter other than ``not_by``, if after ``moment``."""
        return next((e["t"] for e in list(self.events)
                     if e["event"] == "ok_on" and e["t"] > moment and e["arbiter"] not in not_by), None)

    def gaps(self, start: float, end: float) -> list[float]:
        """Its pauses between two successes that overlap [start, end]; an open one counts to ``end``."""
        gaps = [e["gap"] for e in list(self.events) if e["event"] == "gap" and e["end"] >= start and e["start"] <= end]
        tick = self.last("tick")
        if tick and tick["last_ok"] < end:
            gaps.append(round(end - max(tick["last_ok"], start), 3))
        return gaps

    def errors(self) -> dict:
        """Its errors by class so far."""
        tick = self.last("end") or self.last("tick")
        return dict(tick["errors"]) if tick else {}

    def finish(self, timeout: float = 30) -> dict | None:
        """Close its stdin, wait for it (SIGKILL past ``timeout``); its last event."""
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(5)
        return self.events[-1] if self.events else None


def delta(after: dict, before: dict) -> dict:
    """Counts by class in ``after`` less those in ``before``."""
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


# ---------------------------------------------------------------- a phase's pipe directory


class Run:
    """One phase's pipe directory, its control daemon(s), and every process they started."""

    def __init__(self, tmp: Path, code: Path, name: str, **env: str):
        self.tmp, self.code, self.pipe = tmp, code, tmp / name
        self.base_env = env
        self.daemons: list[int] = []
        self.arbiters: set[int] = set()

    def env(self, **extra: str) -> dict:
        """The environment of a child: this checkout first, the phase's settings."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIBSHARE_")}
        env.update(self.base_env, **extra, PYTHONPATH=str(self.code))
        return env

    def control(self, *args: str, timeout: float = 120) -> tuple[int, str]:
        """``libshare-control --pipe-directory DIR ARGS``: its status and output."""
        try:
            done = subprocess.run([sys.executable, "-m", "libshare.control", "--pipe-directory", str(self.pipe), *args],
                                  cwd=self.tmp, env=self.env(), capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return -1, f"(no answer within {timeout} s)"
        return done.returncode, (done.stdout + done.stderr).strip()[-1500:]

    def start_daemon(self) -> tuple[int, str]:
        """``libshare-control -d``; the daemon's pid is remembered."""
        rc, out = self.control("-d")
        pid = self.daemon_pid()
        if pid and pid not in self.daemons and alive(pid):
            self.daemons.append(pid)
        return rc, out

    def daemon_pid(self) -> int | None:
        """The pid in control-daemon.pid."""
        return _read_pid(self.pipe / "control-daemon.pid")

    def arbiter(self) -> int | None:
        """The pid in arbiter.pid (the serving arbiter)."""
        pid = _read_pid(self.pipe / "arbiter.pid")
        if pid:
            self.arbiters.add(pid)
        return pid

    def log(self, name: str = "control.log") -> str:
        try:
            return (self.pipe / name).read_text(errors="replace")
        except OSError:
            return ""

    def tails(self, lines: int = 25) -> dict:
        """The last lines of control.log and server.log."""
        return {name: self.log(name).splitlines()[-lines:] for name in ("control.log", "server.log")}

    def standbys(self) -> int:
        return self.log().count(" stands by")

    def lines_about(self, pid: int) -> list[str]:
        """control.log's lines naming arbiter ``pid``."""
        return [line for line in self.log().splitlines() if f"pid {pid}" in line]

    def stop(self) -> None:
        """``quit``, then SIGKILL whatever this phase started that still runs."""
        self.control("quit", timeout=30)
        wait_for(lambda: not any(alive(p) for p in self.daemons), 30, 0.1)
        for pid in self.daemons:
            self.arbiters.update(children_of(pid))
        for pid in [*self.daemons, *self.arbiters]:
            if alive(pid):
                for child in children_of(pid):
                    kill(child)
                kill(pid)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def start_phase(run: Run, honest_env: dict | None = None) -> tuple[Child | None, dict]:
    """Start the control daemon, wait for a standby, start the honest client and its first success."""
    rc, out = run.start_daemon()
    report = {"daemon_rc": rc, "daemon_output": out[-300:]}
    if rc != 0:
        report["logs"] = run.tails()
        return None, report
    daemon = run.daemon_pid() or 0
    wait_for(lambda: run.standbys() >= 1 and len(children_of(daemon)) >= 2, 120, 0.1)  # a standby beside it
    report["first_arbiter"] = run.arbiter()
    report["engine_module"] = engine_module(report["first_arbiter"])
    honest = Child(run, "--honest", str(run.pipe), **(honest_env or {}))
    if not wait_for(lambda: honest.ok_after(0) or honest.event("failed"), 120, 0.1) or honest.event("failed"):
        report["honest_failed"] = honest.event("failed")
    report["honest_libshare"] = (honest.event("ready") or {}).get("libshare")
    return honest, report


# ---------------------------------------------------------------- the phases


def phase_runaway(run: Run, runaways: int, watchdog: float) -> dict:
    """Runaway clients beside an honest one, under a ``watchdog`` second watchdog."""
    honest, report = start_phase(run)
    if honest is None:
        return report
    report["runaways"] = []
    try:
        for index in range(runaways):
            progress(f"runaway {index + 1}/{runaways}")
            report["runaways"].append(one_runaway(run, honest))
            if report["runaways"][-1].get("honest_computed_again_within_30s") is False:
                honest.finish(5)  # its session is dead: the next runaway gets a live one
                honest = Child(run, "--honest", str(run.pipe))
                report["runaways"][-1]["honest_replaced"] = bool(wait_for(lambda: honest.ok_after(0), 60, 0.1))
            wait_for(lambda: len([p for p in children_of(run.daemon_pid() or 0)]) >= 2, 60, 0.1)  # a standby again
        report["honest_end"] = honest.finish()
    finally:
        honest.finish(5)
    return report


def one_runaway(run: Run, honest: Child) -> dict:
    """One runaway client: what it and the honest client saw, and the arbiter's end."""
    first, errors_before = run.arbiter(), honest.errors()
    runaway = Child(run, "--runaway", str(run.pipe))
    dispatched = wait_for(lambda: runaway.event("dispatched") or runaway.event("failed"), 60, 0.05)
    refused = None
    if dispatched and dispatched["event"] == "failed" and dispatched["error"] in ("Quarantined", "AccessDenied"):
        runaway.finish(5)  # the quarantine refused it (busy.comp's strikes): said, cleared, tried again
        refused = {**_short(dispatched), "clear_quarantine": run.control("clear_quarantine", "all", timeout=30)}
        runaway = Child(run, "--runaway", str(run.pipe))
        dispatched = wait_for(lambda: runaway.event("dispatched") or runaway.event("failed"), 60, 0.05)
    if not dispatched or dispatched["event"] == "failed":
        runaway.finish(5)
        return {"runaway_failed": dispatched, "refused_first": refused, "logs": run.tails()}
    t0 = dispatched["t"]
    new_arbiter = new_at = None
    deadline = t0 + 200
    while time.monotonic() < deadline:
        pid = run.arbiter()
        if new_arbiter is None and pid not in (None, first):
            new_arbiter, new_at = pid, time.monotonic()
        if runaway.process.poll() is not None and (new_arbiter or time.monotonic() > t0 + 60):
            break
        time.sleep(0.02)
    runaway.finish(5)
    errored = runaway.event("ticket") or {}
    moment = errored.get("t", t0)
    recovered = wait_for(lambda: honest.served_after(t0, first), max(0.0, moment + RECOVERY_WAIT - time.monotonic()),
                         0.1)
    status = run.control("get_server_status", timeout=30) if new_arbiter else None
    return {
        "refused_first": refused,
        "runaway_ticket": _short(errored), "runaway_next_call": _short(runaway.event("next_call")),
        "runaway_second_call": _short(runaway.event("second_call")),
        "runaway_error_after_s": round(moment - t0, 3) if errored else None,
        "honest_longest_gap_s": max(honest.gaps(t0, recovered or time.monotonic()), default=0.0),
        "honest_errors": delta(honest.errors(), errors_before),
        "honest_computed_again_within_30s": bool(recovered),
        "honest_computed_again_after_s": round(recovered - moment, 3) if recovered else None,
        "arbiter": first, "arbiter_alive": alive(first), "arbiter_lines": run.lines_about(first)[-4:],
        "new_arbiter": new_arbiter, "new_arbiter_after_s": round(new_at - t0, 3) if new_at else None,
        "new_arbiter_status": status,
        **({} if recovered and new_arbiter else {"logs": run.tails()}),
    }


def _short(event: dict | None) -> dict | None:
    """A child's event without its clock."""
    return None if event is None else {k: v for k, v in event.items() if k not in ("t", "event")}


def calibrate(run: Run, seconds: float) -> tuple[int, float]:
    """Rounds that make the long dispatch last ``seconds`` here, from one run of CALIBRATION_ITERATIONS."""
    probe = Child(run, "--long", str(run.pipe), "--iterations", str(CALIBRATION_ITERATIONS))
    end = wait_for(lambda: probe.event("end"), 300, 0.1)
    probe.finish(10)
    took = end["seconds"] if end else 1.0
    return max(1, round(CALIBRATION_ITERATIONS * seconds / took)), took


def phase_restart(run: Run, iterations: int | None, seconds: float, restart_at: float) -> dict:
    """``restart`` while a low-priority client's long cut dispatch runs beside a high-priority one."""
    honest, report = start_phase(run, {"LIBSHARE_CLIENT_PRIORITY": "high"})
    if honest is None:
        return report
    try:
        if iterations is None:
            iterations, took = calibrate(run, seconds)
            report["calibration"] = {"iterations": CALIBRATION_ITERATIONS, "seconds": took}
        report["long_iterations"] = iterations
        first, errors_before = run.arbiter(), honest.errors()
        long = Child(run, "--long", str(run.pipe), "--iterations", str(iterations))
        started = wait_for(lambda: long.event("dispatched"), 60, 0.05)
        under_way = wait_for(lambda: long.event("under_way") or long.event("end"), 120, 0.05)
        report["long_under_way_after_s"] = round(under_way["t"] - started["t"], 3) if under_way and started else None
        if started:  # ``restart_at`` of its expected length in
            time.sleep(max(0.0, started["t"] + seconds * restart_at - time.monotonic()))
        progress("restart: the long dispatch runs in pieces; restart")
        asked = time.monotonic()
        report["restart_rc"], report["restart_output"] = run.control("restart", timeout=60)
        new = wait_for(lambda: run.arbiter() not in (None, first) and run.arbiter(), 120, 0.02)
        report["new_arbiter_after_restart_s"] = round(time.monotonic() - asked, 3) if new else None
        end = wait_for(lambda: long.event("end"), 300, 0.1)
        long.finish(10)
        wait_for(lambda: honest.ok_after(time.monotonic() - 0.5), 30, 0.1)
        report.update({
            "restart_at_s": round(asked - started["t"], 3) if started else None,
            "long_end": _short(end),
            "long_ended_after_restart_s": round(end["t"] - asked, 3) if end else None,
            "honest_worst_pause_s": max(honest.gaps(started["t"] if started else asked, time.monotonic()), default=0.0),
            "honest_errors": delta(honest.errors(), errors_before),
            "old_arbiter": first, "old_arbiter_lines": run.lines_about(first)[-4:],
            "still_ran_after_in_log": "still ran after" in run.log(),
        })
        if not end or end.get("error") or not end.get("correct") or report["honest_errors"]:
            report["logs"] = run.tails()
        report["honest_end"] = honest.finish()
    finally:
        honest.finish(5)
    return report


_BACKOFF = re.compile(r"the next starts in ([0-9.]+) s")


def phase_burst(run: Run, ceiling: float, most_kills: int) -> dict:
    """Kill standbys as they appear until the back-off stops growing, then the active arbiter."""
    honest, report = start_phase(run)
    if honest is None:
        return report
    try:
        first, daemon, errors_before = run.arbiter(), run.daemon_pid(), honest.errors()
        killed: set[int] = set()
        delays: list[float] = []
        began = time.monotonic()
        while len(killed) < most_kills and time.monotonic() < began + 240:
            serving = run.arbiter()
            for pid in children_of(daemon):
                if pid != serving and pid != first and pid not in killed:
                    kill(pid)
                    killed.add(pid)
                    run.arbiters.add(pid)
            delays = [float(d) for d in _BACKOFF.findall(run.log())]
            if delays and (delays[-1] >= ceiling or (len(delays) >= 2 and delays[-1] == delays[-2])):
                break
            time.sleep(0.01)
        progress(f"burst: {len(killed)} standbys killed, back-offs {delays}; SIGKILL the active arbiter")
        killed_at = time.monotonic()
        kill(first)
        new = wait_for(lambda: run.arbiter() not in (None, first) and alive(run.arbiter()) and run.arbiter(), 120, 0.02)
        new_at = time.monotonic()
        recovered = wait_for(lambda: honest.served_after(killed_at, first), RECOVERY_WAIT + 5, 0.1)
        errors = delta(honest.errors(), errors_before)
        report.update({
            "standbys_killed": len(killed), "burst_seconds": round(killed_at - began, 3), "backoffs_logged": delays,
            "new_arbiter_after_s": round(new_at - killed_at, 3) if new else None,
            "honest_computed_again_after_s": round(recovered - killed_at, 3) if recovered else None,
            "honest_longest_gap_s": max(honest.gaps(killed_at, recovered or time.monotonic()), default=0.0),
            "honest_errors": errors,
            "sessions_lost": sum(v for k, v in errors.items() if k != "ArbiterRestarted"),
        })
        if not recovered or report["sessions_lost"]:
            report["logs"] = run.tails()
        report["honest_end"] = honest.finish()
    finally:
        honest.finish(5)
    return report


def phase_adopt(run: Run) -> dict:
    """SIGKILL the control daemon; ``restart``; ``-d`` again; then SIGKILL the serving arbiter."""
    honest, report = start_phase(run)
    if honest is None:
        return report
    try:
        first, daemon, errors_before = run.arbiter(), run.daemon_pid(), honest.errors()
        standby = [pid for pid in children_of(daemon) if pid != first]
        kill(daemon)
        wait_for(lambda: not alive(daemon), 30, 0.05)
        noticed = wait_for(lambda: "control daemon is gone" in run.log(), 10, 0.1)
        report["arbiter_noticed"] = bool(noticed)
        report["standby_alive_after_daemon_kill"] = [alive(pid) for pid in standby]
        report["restart_rc"], report["restart_output"] = run.control("restart", timeout=60)
        time.sleep(1)
        report["serving_after_restart"] = run.arbiter()
        report["restart_changed_arbiter"] = run.arbiter() not in (None, first)
        report["second_daemon_rc"], report["second_daemon_output"] = run.start_daemon()
        adopter = run.daemon_pid()
        report["new_daemon"] = adopter if adopter != daemon and alive(adopter) else None
        serving = run.arbiter()
        report["serving_after_daemon"] = serving
        report["first_arbiter_alive"] = alive(first)
        if report["new_daemon"]:
            wait_for(lambda: len(children_of(adopter)) >= 2, 120, 0.1)  # a standby of the adopter
        progress(f"adopt: SIGKILL the serving arbiter {serving}")
        killed_at = time.monotonic()
        kill(serving)
        new = wait_for(lambda: run.arbiter() not in (None, serving, first) and alive(run.arbiter()) and run.arbiter(),
                       60, 0.02)
        recovered = wait_for(lambda: honest.served_after(killed_at, serving, first), RECOVERY_WAIT, 0.1)
        report.update({
            "new_arbiter_after_kill": new,
            "honest_computed_again_after_kill_s": round(recovered - killed_at, 3) if recovered else None,
            "honest_errors": delta(honest.errors(), errors_before),
        })
        if not recovered:
            report["logs"] = run.tails()
        report["honest_end"] = honest.finish()
    finally:
        honest.finish(5)
    return report


# ---------------------------------------------------------------- main


PHASES = ("runaway", "restart", "burst", "adopt")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated, of " + ", ".join(PHASES))
    parser.add_argument("--watchdog", type=float, default=1.0, help="LIBSHARE_WATCHDOG_SECONDS of the runaway phase")
    parser.add_argument("--runaways", type=int, default=3)
    parser.add_argument("--long-seconds", type=float, default=15.0, help="how long the restart phase's dispatch lasts")
    parser.add_argument("--restart-at", type=float, default=0.2,
                        help="restart this fraction of --long-seconds into it (the default leaves 12 s, more than "
                             "the 10 s --shutdown-timeout a retiring arbiter had before)")
    parser.add_argument("--long-iterations", type=int, default=None, help="its rounds (default: calibrated)")
    parser.add_argument("--burst-ceiling", type=float, default=30.0,
                        help="stop killing standbys once a back-off this long is logged (or it stops growing)")
    parser.add_argument("--burst-kills", type=int, default=25, help="at most this many standbys killed")
    parser.add_argument("--honest", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--runaway", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--long", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--iterations", type=int, default=CALIBRATION_ITERATIONS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.honest:
        return honest_main(args.honest)
    if args.runaway:
        return runaway_main(args.runaway)
    if args.long:
        return long_main(args.long, args.iterations)

    import libshare

    code = Path(libshare.__file__).resolve().parent.parent
    phases = [p for p in args.phases.split(",") if p]
    unknown = set(phases) - set(PHASES)
    if unknown:
        parser.error(f"unknown phases {sorted(unknown)}")
    report = {"libshare": libshare.__file__, "phases": {}}
    with tempfile.TemporaryDirectory(prefix="attack-containment-") as tmp:
        for phase in phases:
            progress(f"{phase}: starting")
            env = {"runaway": {"LIBSHARE_WATCHDOG_SECONDS": f"{args.watchdog:g}"},
                   "restart": {"LIBSHARE_SCHEDULING": "fairshare"}}.get(phase, {})
            run = Run(Path(tmp), code, phase, **env)
            started = time.monotonic()
            try:
                if phase == "runaway":
                    result = phase_runaway(run, args.runaways, args.watchdog)
                elif phase == "restart":
                    result = phase_restart(run, args.long_iterations, args.long_seconds, args.restart_at)
                elif phase == "burst":
                    result = phase_burst(run, args.burst_ceiling, args.burst_kills)
                else:
                    result = phase_adopt(run)
            except Exception as exc:  # noqa: BLE001 - the other phases still run
                result = {"tool_error": f"{type(exc).__name__}: {exc}", "logs": run.tails()}
            finally:
                run.stop()
            result["seconds"] = round(time.monotonic() - started, 1)
            report["phases"][phase] = result
            progress(f"{phase}: done in {result['seconds']} s")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
