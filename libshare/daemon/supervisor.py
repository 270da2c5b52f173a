"""The control daemon: a small process that keeps an arbiter serving a pipe directory.

``libshare-control -d`` (and ``-f``, and the systemd unit) runs this process; it starts
the arbiter (the server, as MPS separates ``nvidia-cuda-mps-control`` from
``nvidia-cuda-mps-server``) as its child, and starts a new one whenever that one exits
for any reason other than a deliberate stop: a crash signal in a driver, SIGKILL, a
runaway dispatch it could not recover from (status 75), a lost device. It does no
Vulkan and opens no socket: nothing a client sends reaches it. It speaks only to its
own children, each over a socket pair made at spawn (``--supervisor-fd``), in lines:

* child to daemon: ``standby`` (device made, waiting for the word to serve), ``active``
  (it holds the lock and serves the socket), ``restart`` (an operator asked for a new
  arbiter), ``released`` (handing over: it let go of socket and lock);
* daemon to child: ``go`` (take the lock and serve), ``handover`` (let a new one serve).

**A warm standby.** Making a device and the vetting compilers takes most of an
arbiter's start (0.5 s on lavapipe, more on a GPU). So beside the active arbiter the
daemon keeps one more child that has done all of that and waits, without the lock, for
``go``. When the active one dies the kernel drops its lock; the daemon, woken by the
closed socket pair, says ``go``, and the standby serves at once. Sessions reattach to it
by themselves (see libshare/client/reattach.py). A new standby is then started; if arbiters keep dying young
(more than one within a minute died less than 2 s after it was started), each new start
waits longer (0.25 s, doubling to 4 s: :func:`backoff`), so that a crash loop costs little
and sessions still wait it out (they wait 30 s at least for a new arbiter); control.log
says why each one ended. An arbiter that a client crashes at once again and again is
also quarantined (_quarantine.py).

**Stopping.** An active arbiter that exits with status 0 was told to stop (``quit``,
SIGTERM): the daemon stops its standby and exits too, removing its lock file. SIGTERM or
SIGINT to the daemon is passed on to its children the same way.

**Configuration.** With ``--config FILE`` the daemon checks the file before it starts any
arbiter (a bad one: it does not start, and says why), and passes the option on to each
child, which reads the file itself (config_file.py). SIGHUP to the daemon is passed on to the
active arbiter, which reads the file again; a standby reads it again when it takes over.

**Restart.** ``libshare-control restart`` asks the active arbiter, which tells the daemon
(``restart``). The daemon replaces the standby with a fresh one (new code, new driver),
waits for it to be ready, then sends ``handover`` to the active arbiter: that one stops
accepting, removes its socket and lock, answers ``released`` and moves its clients (see
``Arbiter.hand_over``), and the standby gets ``go``.

**Adopting.** An arbiter outlives its control daemon (a SIGKILL, an OOM kill): it serves on,
unsupervised, and says so (libshare/arbiter/service.py: ``restart`` is refused, a stuck
device enters FAULT, sessions are told no new arbiter will come). A control daemon started
on that pipe directory adopts it: once its own first arbiter stands by, it sends the
serving one ``hand_over`` on its control socket (a hand-over, as for ``restart``: its
clients pause and move), waits until that one lets go of the lock, and says ``go``. The
same adopts an arbiter started without a control daemon (``python -m libshare.arbiter``).

One control daemon per pipe directory: it holds an ``flock`` on ``control-daemon.pid``
(``_config.supervised`` tells a session whether to wait for a new arbiter).
"""

from __future__ import annotations

import fcntl
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from libshare.protocol import paths as _config
from libshare.protocol.control import ControlConnection
from libshare.daemon.directory import holder, prepare_directory, serving_pid
from libshare.daemon.logs import configure_logging
from libshare.daemon.options import EXIT_CANNOT_START, EXIT_UNRECOVERABLE, Options, STDERR_FILE
from libshare.daemon import config_file
from libshare.errors import AlreadyServing, ArbiterLost, ArbiterUnavailable, ConfigError, LibshareError

log = logging.getLogger("libshare.control")

_BACKOFF_FIRST = 0.25  # seconds before a new start once arbiters keep failing, doubling each time
BACKOFF_MAX = 4.0
"""The longest wait before a new start: well inside what a session waits for a new arbiter
(``REPLACEMENT_WAIT`` in libshare/protocol/paths.py), so a burst of deaths pauses sessions."""
_FAILURE_WINDOW = 60.0  # failures within this many seconds count towards the back-off
_SHORT_LIFE = 2.0  # an arbiter that dies younger than this (seconds) counts as a failure to start
_STOP_TIMEOUT = 30.0  # seconds children get to stop before SIGKILL
_ADOPT_TIMEOUT = 30.0  # seconds an adopted arbiter has to answer hand_over, and then to let go of its lock
_ADOPT_POLL = 0.05  # seconds between looks at the lock an adopted arbiter lets go of


@dataclass(eq=False)
class Child:
    """One arbiter process the daemon started, and what it last said."""

    process: subprocess.Popen
    link: socket.socket
    state: str = "starting"  # starting, standby, going, active; retiring (handed over), dismissed
    started: float = field(default_factory=time.monotonic)
    buffer: bytes = b""

    @property
    def pid(self) -> int:
        """The arbiter's pid."""
        return self.process.pid

    def tell(self, word: str) -> None:
        """Send one line; a child that is gone is noticed by its closed link."""
        try:
            self.link.sendall(word.encode() + b"\n")
        except OSError:
            pass


class Supervisor:
    """The control daemon's loop (see the module's essay); :meth:`run` returns its exit status."""

    def __init__(self, options: Options):
        self.options = options
        self.children: list[Child] = []
        self.stopping = ""
        self._stop_deadline = 0.0
        self.restart_asked = False
        self.served = False  # an arbiter has served: from then on a failed start is retried
        self.status = 0  # the daemon's exit status
        self._failures: list[float] = []
        self._next_start = 0.0
        self._selector = selectors.DefaultSelector()
        self._signal_r, self._signal_w = socket.socketpair()
        self._hangup = False  # a SIGHUP to pass on to the active arbiter
        self._adopting: str | None = None  # the pid of an unsupervised arbiter found serving, until it hands over

    # ---------------------------------------------------------------- the loop

    def run(self) -> int:
        """Supervise until the active arbiter stops deliberately or this process is told to stop."""
        lock = self._take_lock()
        try:
            self._install_signals()
            self._start()
            while self.children or not self.stopping:
                self._turn()
            log.info("control daemon pid %d stopped (%s)", os.getpid(), self.stopping)
            return self.status
        finally:
            _config.supervisor_lock_path(self.options.pipe_directory).unlink(missing_ok=True)
            os.close(lock)

    def _take_lock(self) -> int:
        directory = self.options.pipe_directory
        prepare_directory(directory, self.options.multi_user)
        path = _config.supervisor_lock_path(directory)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyServing(f"another control daemon (pid {holder(path)}) supervises "
                                         f"{directory}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._adopting = serving_pid(directory)  # (checked under our lock: no control daemon has it)
        if self._adopting is not None:
            log.info("arbiter pid %s serves %s without a control daemon: it hands over to this one's first "
                     "arbiter once that is ready", self._adopting, directory)
        return fd

    def _install_signals(self) -> None:
        self._signal_r.setblocking(False)
        self._signal_w.setblocking(False)
        signal.set_wakeup_fd(self._signal_w.fileno())
        signal.signal(signal.SIGCHLD, lambda *_: None)  # the wake-up byte is what counts
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda number, _frame: self._stop(signal.Signals(number).name))
        signal.signal(signal.SIGHUP, lambda *_: setattr(self, "_hangup", True))  # passed on in _turn
        self._selector.register(self._signal_r, selectors.EVENT_READ, None)

    def _turn(self) -> None:
        timeout = None
        if self._next_start and not self.stopping:
            timeout = max(self._next_start - time.monotonic(), 0)
        if self.stopping:
            timeout = 1.0
            if time.monotonic() > self._stop_deadline:
                for child in self.children:
                    child.process.kill()
        for key, _ in self._selector.select(timeout):
            if key.data is None:
                try:
                    self._signal_r.recv(4096)
                except BlockingIOError:
                    pass
            else:
                self._read(key.data)
        if self._hangup:
            self._hangup = False
            self._pass_hangup()
        self._reap()
        if self._next_start and time.monotonic() >= self._next_start and not self.stopping:
            self._next_start = 0.0
            self._start()

    # ---------------------------------------------------------------- children

    def _start(self) -> None:
        """Start an arbiter; it reports ``standby`` once its device is made."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        stderr_path = self.options.log_directory / STDERR_FILE
        try:
            with open(stderr_path, "ab") as stderr:
                process = subprocess.Popen(
                    [sys.executable, "-m", "libshare.arbiter", "--quiet", *self.options.argv(),
                     "--supervisor-fd", str(theirs.fileno())],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                    pass_fds=(theirs.fileno(),), close_fds=True, cwd="/")
        except OSError as exc:
            mine.close()
            log.error("could not start an arbiter: %s", exc)
            self._failed()
            return
        finally:
            theirs.close()
        child = Child(process, mine)
        self.children.append(child)
        self._selector.register(mine, selectors.EVENT_READ, child)

    def _read(self, child: Child) -> None:
        try:
            data = child.link.recv(4096)
        except OSError:
            data = b""
        if not data:
            self._selector.unregister(child.link)
            return  # it exited (or is exiting): _reap says how
        child.buffer += data
        while b"\n" in child.buffer:
            line, child.buffer = child.buffer.split(b"\n", 1)
            self._heard(child, line.decode(errors="replace").strip())
        child.buffer = child.buffer[-256:]  # a child says short words

    def _heard(self, child: Child, word: str) -> None:
        if child.state == "dismissed":
            return  # told to leave (SIGTERM): what it said before it heard is moot (a "standby" said just
            # before a restart dismissed it made it the restart's arbiter, which then left at the SIGTERM)
        if word == "standby":
            child.state = "standby"
            if self.stopping:
                self._end(child)
            elif self.active() is None and self._adopting is not None:
                self._adopt(child)
            elif self.active() is None:
                self._go(child)
            elif self.restart_asked:
                self.restart_asked = False
                log.info("arbiter pid %d is ready: arbiter pid %d hands over to it", child.pid, self.active().pid)
                self.active().tell("handover")
            else:
                log.info("arbiter pid %d stands by", child.pid)
        elif word == "active":
            child.state = "active"
            self.served = True
            log.info("arbiter pid %d serves %s", child.pid, self.options.pipe_directory)
            self._ensure_standby()
        elif word == "restart" and child.state == "active":
            log.info("arbiter pid %d asks for a restart: starting a fresh arbiter to take over", child.pid)
            self.restart_asked = True
            for other in self.children:
                if other.state in ("starting", "standby"):
                    self._end(other)
            self._start()
        elif word == "released" and child.state == "active":
            child.state = "retiring"
            standby = self._standby()
            if standby is not None:
                self._go(standby)

    def _adopt(self, standby: Child) -> None:
        """Have the unsupervised arbiter found serving hand over to ``standby`` (see "Adopting"):
        ask it (``hand_over``), wait until it lets go of the lock, then let the standby serve.
        One that refuses or does not let go stops this daemon, which says why."""
        pid, self._adopting = self._adopting, None
        directory = self.options.pipe_directory
        try:
            with ControlConnection(directory, timeout=_ADOPT_TIMEOUT) as connection:
                connection.run("hand_over")
        except (ArbiterLost, ArbiterUnavailable):
            pass  # it closed this connection (and its socket) as it stopped accepting: the lock tells
        except (LibshareError, OSError) as exc:
            self._not_adopted(pid, str(exc))
            return
        deadline = time.monotonic() + _ADOPT_TIMEOUT
        while serving_pid(directory) == pid and time.monotonic() < deadline:
            time.sleep(_ADOPT_POLL)
        if serving_pid(directory) is not None:
            self._not_adopted(pid, f"it still held {_config.lock_path(directory)} after {_ADOPT_TIMEOUT:g} s")
            return
        log.info("arbiter pid %s handed over: arbiter pid %d serves under this control daemon", pid, standby.pid)
        self._go(standby)

    def _not_adopted(self, pid: str, why: str) -> None:
        log.error("arbiter pid %s, serving without a control daemon, was not adopted: %s", pid, why)
        self.status = 1
        self._stop(f"arbiter pid {pid} could not be adopted")

    def _pass_hangup(self) -> None:
        """Pass a SIGHUP on to the active arbiter: it reads its configuration file again."""
        active = self.active()
        if active is None or self.stopping:
            log.warning("SIGHUP: no arbiter serves now; the next one reads the configuration file when it starts")
            return
        log.info("SIGHUP: passed on to arbiter pid %d (it reads its configuration file again)", active.pid)
        try:
            active.process.send_signal(signal.SIGHUP)
        except ProcessLookupError:
            pass

    def _go(self, child: Child) -> None:
        child.state = "going"
        child.tell("go")

    def _reap(self) -> None:
        for child in list(self.children):
            status = child.process.poll()
            if status is None:
                continue
            self.children.remove(child)
            try:
                self._selector.unregister(child.link)
            except (KeyError, ValueError):
                pass
            child.link.close()
            self._exited(child, status)

    def _exited(self, child: Child, status: int) -> None:
        why = _describe(status)
        lived = time.monotonic() - child.started
        if self.stopping or child.state in ("retiring", "dismissed"):
            done = {"retiring": "handed over and ", "dismissed": "(a standby no longer needed) "}
            log.info("arbiter pid %d %s%s", child.pid, done.get(child.state, ""), why)
            return
        if child.state in ("active", "going") and status == 0:
            log.info("arbiter pid %d stopped (%s): the control daemon stops too", child.pid, why)
            self._stop("the arbiter stopped")
            return
        if status == EXIT_CANNOT_START and not self.served:  # a bad option, no device: trying again won't help
            log.error("arbiter pid %d could not start (see %s): the control daemon stops", child.pid,
                      self.options.log_directory / STDERR_FILE)
            self.status = 1
            self._stop("the first arbiter could not start")
            return
        if status == 0 and child.state in ("starting", "standby"):
            log.info("standby arbiter pid %d %s; starting another", child.pid, why)
        else:
            log.error("arbiter pid %d (%s) %s after %.1f s", child.pid, child.state, why, lived)
            if lived < _SHORT_LIFE:
                self._failed()
        standby = self._standby()
        if child.state in ("active", "going") and standby is not None:
            log.info("arbiter pid %d takes over", standby.pid)
            self._go(standby)
        self._ensure_standby()

    def _failed(self) -> None:
        now = time.monotonic()
        self._failures = [t for t in self._failures if now - t < _FAILURE_WINDOW] + [now]

    def _ensure_standby(self) -> None:
        """Start one more arbiter unless one is starting or waiting (after the back-off, if any)."""
        if self.stopping or self._next_start or any(c.state in ("starting", "standby") for c in self.children):
            return
        failures = len(self._failures)
        delay = backoff(failures)
        if delay:
            log.warning("%d arbiters failed within %.0f s: the next starts in %.2f s", failures,
                        _FAILURE_WINDOW, delay)
            self._next_start = time.monotonic() + delay
        else:
            self._start()

    def active(self) -> Child | None:
        """The child that serves (or was told to), if any."""
        return next((c for c in self.children if c.state in ("active", "going")), None)

    def _standby(self) -> Child | None:
        return next((c for c in self.children if c.state == "standby"), None)

    # ---------------------------------------------------------------- stopping

    def _stop(self, reason: str) -> None:
        if self.stopping:
            return
        self.stopping = reason
        self._stop_deadline = time.monotonic() + _STOP_TIMEOUT
        self._next_start = 0.0
        for child in self.children:
            self._end(child)

    def _end(self, child: Child) -> None:
        """Stop a child: SIGTERM (a standby leaves at once, an active arbiter stops gracefully)."""
        if child.state in ("starting", "standby"):
            child.state = "dismissed"
        try:
            child.process.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass


def backoff(failures: int) -> float:
    """Seconds before the next start after ``failures`` arbiters died young within the window:
    none for the first, then 0.25 s doubling up to :data:`BACKOFF_MAX`."""
    return 0.0 if failures <= 1 else min(_BACKOFF_FIRST * 2 ** (failures - 2), BACKOFF_MAX)


def _describe(status: int) -> str:
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    if status == EXIT_UNRECOVERABLE:
        return f"exited with status {status} (its device was stuck: a runaway dispatch or a lost device; see server.log)"
    return f"exited with status {status}"


def run(options: Options, echo: bool) -> int:
    """Run the control daemon in this process (``libshare-control -f``, and the detached ``-d``)."""
    configure_logging(options.log_directory, echo)
    log.info("control daemon pid %d supervises %s", os.getpid(), options.pipe_directory)
    try:
        if options.config is not None:
            config_file.read(options.config)  # a bad file: no arbiter would start (each child reads it again)
        return Supervisor(options).run()
    except (AlreadyServing, ConfigError, OSError) as exc:
        log.error("the control daemon did not start: %s", exc)
        if not echo:
            print(exc, file=sys.stderr, flush=True)
        return 1
