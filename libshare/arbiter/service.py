"""Running the arbiter as a service: pipe directory, PID lock, stale socket, logs, signals.

One arbiter serves a pipe directory. It proves that by holding an ``flock`` on the
directory's lock file for its whole life (the kernel drops the lock when the process
dies, however it dies), with its pid written inside for whoever is refused. A socket
left behind by a dead arbiter is stale: nobody accepts on it, ``connect`` is refused,
and the new arbiter removes it. A socket that answers belongs to a live arbiter that
holds no lock (an embedded host, an older version): the newcomer names its pid and
leaves. SIGINT and SIGTERM stop gracefully through :meth:`Arbiter.close`; a crash
signal runs the C handler of ``_emergency.c``, which unlinks socket and lock before
the process dies.

:func:`run` is the foreground runner behind ``python -m libshare.arbiter``;
:func:`start_background` starts that same runner as a detached process for
:mod:`libshare.manager`, or the control daemon (_supervisor.py) for
``libshare-control -d``, which runs ``-f`` in the foreground.

Under the control daemon (``--supervisor-fd``) an arbiter starts as a standby: it makes
its device and vetting compilers first, says ``standby`` on its link, and takes the lock
only on ``go`` (:class:`SupervisorLink`). Serving, it says ``active``; ``restart`` reaches
the daemon through it, and ``handover`` makes it stop accepting, give up socket and lock
(its crash handler disarmed: they are the new arbiter's), say ``released`` and move its
clients (:func:`_hand_over`), then stop as after ``quit``.

A daemon arbiter also guards itself as a process (an embedded one is its client's
process and leaves that alone):

* **Non-dumpable** (``prctl(PR_SET_DUMPABLE, 0)``). The arbiter holds every client's
  buffer memfds; a dumpable process's ``/proc/PID/fd/N`` could be opened by any process
  of the same uid, which would then read and write another client's buffers. Non-dumpable,
  its ``/proc/PID`` entries belong to root and ptrace is refused to everyone without
  CAP_SYS_PTRACE. It also means no core dumps of the arbiter.
* **Last for the OOM killer.** The memory a client makes the arbiter hold counts as the
  arbiter's, so without help the kernel would kill the service before the greedy client.
  The arbiter sets its ``oom_score_adj`` to -900, which needs CAP_SYS_RESOURCE (root, or
  ``OOMScoreAdjust=`` in its systemd unit). Refused, it warns and keeps every client's
  ``oom_score_adj`` at least 500 above its own instead (raising needs no privilege, and a
  raised client stays raised after it disconnects), which puts a client first unless it
  lowers its own value back, down to what it started with. An arbiter that inherited a
  raised value (started by a client) first lowers it back to 0, which needs no privilege.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import logging
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from libshare.protocol import paths as _config
from libshare.protocol.control import decimal
from libshare._proc import MAX_PID, parent_of
from libshare.arbiter.serve import config as _settings
from libshare.errors import ArbiterUnavailable, LibshareError

__all__ = ["Options", "AlreadyServing", "StartFailed", "add_arguments", "run", "start_background",
           "configure_logging", "log_handler", "STDERR_FILE", "EXIT_CANNOT_START", "EXIT_UNRECOVERABLE"]

log = logging.getLogger("libshare.arbiter")
control_log = logging.getLogger("libshare.control")

STDERR_FILE = "arbiter.stderr"
"""File in the log directory that receives a background arbiter's standard error."""

EXIT_CANNOT_START = 1
"""Exit status of an arbiter that could not start (a bad option, no such device, the lock is taken)."""

EXIT_UNRECOVERABLE = 75  # EX_TEMPFAIL
"""Exit status of an arbiter whose device cannot be recovered in-process (a dispatch that never ends
outlived the watchdog and the recovery timeout): socket and lock are gone, start a new one."""

_OOM_SCORE_ADJ = -900  # the daemon arbiter's, where it may lower it
_CLIENT_OOM_MARGIN = 500  # otherwise clients are kept this far above the arbiter
_PR_SET_DUMPABLE = 4
_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"  # of a log line's date (_LogFile)


class AlreadyServing(LibshareError):
    """Another arbiter already serves this pipe directory."""


class StartFailed(LibshareError):
    """A background arbiter exited, or did not become ACTIVE, before it could serve."""


@dataclass(frozen=True)
class Options:
    """How to run an arbiter; the fields mirror the command-line options of :func:`add_arguments`."""

    pipe_directory: Path
    log_directory: Path
    device: str | None = None
    max_clients: int | None = None  # None: the configuration file's, else the arbiter's default (48)
    timestamps: bool = True
    placement: bool = True  # the engine and the driver's threads on a core of their own (_placement.py)
    multi_user: bool = False
    metrics_port: int = 0
    metrics_address: str = "127.0.0.1"
    shutdown_timeout: float = 10.0
    supervisor_fd: int = -1  # the control daemon's link (_supervisor.py), or -1; not in argv()
    config: Path | None = None  # the operator's configuration file (_settings.py)

    @classmethod
    def create(cls, pipe_directory=None, log_directory=None, config=None, **fields) -> Options:
        """Options with the pipe and log directories resolved from the LIBSHARE_* environment
        (and the configuration file's path made absolute: a daemon's children run in /)."""
        pipe = _config.pipe_directory(pipe_directory).absolute()
        logs = _config.log_directory(log_directory, pipe).absolute()
        return cls(pipe, logs, config=None if config is None else Path(config).absolute(), **fields)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Options:
        """Options from a namespace parsed by a parser that :func:`add_arguments` filled."""
        return cls.create(args.pipe_directory, args.log_directory, device=args.device,
                          max_clients=args.max_clients, timestamps=not args.no_timestamps,
                          placement=not args.no_placement and os.environ.get("LIBSHARE_PLACEMENT") != "0",
                          multi_user=args.multi_user, metrics_port=args.metrics_port,
                          metrics_address=args.metrics_address, shutdown_timeout=args.shutdown_timeout,
                          supervisor_fd=args.supervisor_fd, config=args.config)

    def argv(self) -> list[str]:
        """The command-line options that reproduce these options."""
        argv = ["--pipe-directory", str(self.pipe_directory), "--log-directory", str(self.log_directory),
                "--shutdown-timeout", str(self.shutdown_timeout)]
        if self.max_clients is not None:
            argv += ["--max-clients", str(self.max_clients)]
        if self.config is not None:
            argv += ["--config", str(self.config)]
        if self.device is not None:
            argv += ["--device", str(self.device)]
        if not self.timestamps:
            argv.append("--no-timestamps")
        if not self.placement:
            argv.append("--no-placement")
        if self.multi_user:
            argv.append("--multi-user")
        if self.metrics_port:
            argv += ["--metrics-port", str(self.metrics_port), "--metrics-address", self.metrics_address]
        return argv


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port 0..65535 (got {value})")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arbiter's options (shared by ``python -m libshare.arbiter`` and ``libshare-control``)."""
    group = parser.add_argument_group("arbiter options")
    group.add_argument("--pipe-directory", default=None,
                       help="where the control socket and lock file live (default: LIBSHARE_PIPE_DIRECTORY, "
                            "else $XDG_RUNTIME_DIR/libshare, else /tmp/libshare-$UID)")
    group.add_argument("--log-directory", default=None,
                       help="where server.log and control.log go (default: LIBSHARE_LOG_DIRECTORY, "
                            "else the pipe directory)")
    group.add_argument("--device", default=None, help="Vulkan device index or UUID (default: LIBSHARE_DEVICE, else 0)")
    group.add_argument("--max-clients", type=_positive_int, default=None,
                       help="clients served at once (default: max_clients of --config, else 48)")
    group.add_argument("--config", default=None, metavar="FILE",
                       help="the operator's configuration (TOML: [defaults] and [groups.NAME]; see README); "
                            "read again on reload and SIGHUP")
    group.add_argument("--no-timestamps", action="store_true",
                       help="skip per-dispatch device timing (no device-time accounting; faster on lavapipe)")
    group.add_argument("--no-placement", action="store_true",
                       help="leave the engine's and the driver's threads on every core (by default, on a CPU "
                            "device, they share one core and the arbiter's other threads get the rest; "
                            "LIBSHARE_PLACEMENT=0 does the same)")
    group.add_argument("--multi-user", action="store_true",
                       help="serve clients of every user (run as root), not only the arbiter's own user")
    group.add_argument("--metrics-port", type=_port, default=0,
                       help="serve Prometheus metrics on this TCP port (default 0: off)")
    group.add_argument("--metrics-address", default="127.0.0.1", help="address of the metrics endpoint")
    group.add_argument("--shutdown-timeout", type=float, default=10.0,
                       help="seconds running work may take to end on SIGINT/SIGTERM (default 10)")
    group.add_argument("--supervisor-fd", type=int, default=-1, help=argparse.SUPPRESS)  # set by the control daemon


# -------------------------------------------------------------------- logs

def log_handler(path: Path) -> logging.Handler:
    """A handler appending timestamped lines (``[date time.ms pid] LEVEL message``) to ``path``,
    which is made readable by its owner and group only: the logs name every client, its group and
    the operator's commands, and in multi-user mode other users could open them by name."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
    try:
        os.fchmod(fd, 0o640)  # one made before, by an older arbiter, as well
    except BaseException:
        os.close(fd)
        raise
    return _LogFile(fd)


class _LogFile(logging.Handler):
    """Lines of ``[date time.ms pid] LEVEL message`` (a traceback after, if any) appended to the
    descriptor ``fd``, which it owns, with one ``os.write`` each (O_APPEND: the lines of several
    processes never interleave), the date formatted once a second.

    A FileHandler's text stream, Formatter and flush made a line cost the arbiter's Python some 40 us,
    and each attach logs two (attach cycles in a loop: 0.85-0.90 ms with it, 0.83 ms with this)."""

    def __init__(self, fd: int):
        super().__init__()
        self.setFormatter(logging.Formatter())  # for tracebacks and stacks
        self._fd = fd
        self._second, self._date = -1, ""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            second = int(record.created)
            if second != self._second:
                self._second, self._date = second, time.strftime(_DATE_FORMAT, time.localtime(second))
            line = f"[{self._date}.{int(record.msecs):03d} {record.process}] {record.levelname} {record.getMessage()}"
            if record.exc_info:
                line += "\n" + self.formatter.formatException(record.exc_info)
            if record.stack_info:
                line += "\n" + self.formatter.formatStack(record.stack_info)
            if self._fd >= 0:
                os.write(self._fd, (line + "\n").encode("utf-8", "replace"))
        except Exception:  # a full disk: what logging does with any handler's failure
            self.handleError(record)

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        with self.lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        super().close()


def configure_logging(log_directory: Path, echo: bool) -> None:
    """Send libshare.arbiter to server.log and libshare.control to control.log (and stderr when ``echo``)."""
    log_directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    for logger, name in ((log, "server.log"), (control_log, "control.log")):
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger.addHandler(log_handler(log_directory / name))
        if echo and (stderr := _stderr_copy()) >= 0:
            logger.addHandler(_LogFile(stderr))


def _stderr_copy() -> int:
    """A descriptor of this process's stderr for a log handler to own, or -1 when there is none (a
    daemon started with its stderr closed logs to its files alone)."""
    try:
        return os.dup(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):  # sys.stderr None, closed, or not a file
        return -1


def _close_logging() -> None:
    for logger in (log, control_log):
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()


# -------------------------------------------------------------------- pipe directory and lock

def prepare_directory(directory: Path, multi_user: bool = False) -> None:
    """Create the pipe directory (or take an existing one) and set its mode: 0700, or in multi-user
    mode 0711, which lets every user reach the socket (0666, set by the arbiter) but not list or
    change the directory. It must be a directory of this uid: one that another user owns could
    have its socket replaced under the arbiter."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    status = os.lstat(directory)
    if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.getuid():
        raise LibshareError(f"the pipe directory {directory} is not a directory of uid {os.getuid()} (owner uid "
                            f"{status.st_uid}); remove it or choose another --pipe-directory")
    os.chmod(directory, 0o711 if multi_user else 0o700)


def holder(path: Path) -> str:
    """The pid written in a held lock file (it may still be empty a moment after it was taken)."""
    for _ in range(20):
        try:
            text = path.read_text().strip()
        except OSError:
            text = ""
        if text:
            return text
        time.sleep(0.01)
    return "unknown"


def serving_pid(directory: Path) -> str | None:
    """The pid of the arbiter that holds ``directory``'s lock, or None when none does."""
    path = _config.lock_path(directory)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return holder(path)
    finally:
        os.close(fd)
    return None


class PidLock:
    """The flock on a pipe directory's lock file, held with this pid written in it."""

    def __init__(self, path: Path, directory: Path):
        self.path = path
        """The lock file."""
        self._fd = self._take(path, directory)
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"{os.getpid()}\n".encode())

    @staticmethod
    def _take(path: Path, directory: Path) -> int:
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise AlreadyServing(f"another arbiter (pid {holder(path)}) serves {directory}") from None
            # The previous holder unlinks the file before it lets go: a lock on an inode that
            # is no longer at ``path`` guards nothing, so take the new file instead.
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)

    def release(self) -> None:
        """Remove the lock file, then let go of the lock. Idempotent."""
        if self._fd < 0:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = -1


def _peer_pid(sock: socket.socket) -> int:
    pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid


def remove_stale_socket(path: Path, directory: Path) -> None:
    """Remove a socket nobody accepts on; raise :class:`AlreadyServing` when one answers."""
    if not os.path.lexists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        probe.settimeout(2.0)
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)
        log.warning("removed stale socket %s (no arbiter answered on it)", path)
        return
    except OSError as exc:
        raise AlreadyServing(f"cannot tell whether {path} is in use ({exc}); remove it if no arbiter runs") from exc
    else:
        raise AlreadyServing(f"another arbiter (pid {_peer_pid(probe)}) serves {directory}")
    finally:
        probe.close()


# -------------------------------------------------------------------- the foreground runner

class _Stop:
    """Why the runner should stop: a signal's name, or the quit command."""

    def __init__(self):
        self.event = threading.Event()
        self.reason = ""
        self.abandoned = False  # work still ran on the device when the arbiter closed (see run)

    def set(self, reason: str) -> None:
        if not self.event.is_set():
            self.reason = reason
            self.event.set()


def _install_signals(stop: _Stop, hangup: int) -> None:
    """SIGINT and SIGTERM stop; SIGHUP reloads. Each signal's number is also written to the pipe
    ``hangup`` by Python's own C-level handler (``signal.set_wakeup_fd``), at once and on whichever
    thread the kernel chose, and :func:`_watch_signals` acts on it: a Python-level handler runs only
    on the main thread, which sleeps in a lock while the arbiter serves, and a signal delivered to
    another thread was seen there only at the next signal (a SIGHUP reload waited for the SIGTERM)."""
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda number, _frame: stop.set(signal.Signals(number).name))
    signal.signal(signal.SIGHUP, lambda _number, _frame: None)  # (a handler, so that the number is written)
    signal.set_wakeup_fd(hangup, warn_on_full_buffer=False)  # full: a byte of each is pending already


def _watch_signals(arbiter, hangup: int, stop: _Stop) -> None:
    """Read the configuration file again on each SIGHUP, and stop on SIGINT and SIGTERM (see
    :func:`_install_signals`; a reload runs control commands, which must not run inside a signal
    handler)."""
    stops = {signal.SIGINT.value, signal.SIGTERM.value}

    def watch():
        while numbers := os.read(hangup, 64):
            for number in numbers:
                if number in stops:
                    stop.set(signal.Signals(number).name)
            if signal.SIGHUP.value in numbers:
                _reload(arbiter, "SIGHUP")

    threading.Thread(target=watch, name="libshare-signals", daemon=True).start()


def _reload(arbiter, why: str) -> None:
    """Read the configuration file again; a bad one is logged (by Config.reload) and changes nothing."""
    try:
        arbiter.config.reload(why)
    except LibshareError:
        pass


def _watch_quit(arbiter, stop: _Stop) -> None:
    """Stop on the quit command, and when the control thread gives the device up."""
    def watch():
        arbiter.quit_requested.wait()
        stop.set("quit command")

    arbiter.drainer.on_unrecoverable = lambda why: stop.set("the device cannot be recovered")
    threading.Thread(target=watch, name="libshare-quit-watch", daemon=True).start()


def run(options: Options, echo: bool = True) -> int:
    """Serve until SIGINT, SIGTERM, the quit command or a device that cannot be recovered.

    Returns 0 after a clean stop, 1 when it cannot start, :data:`EXIT_UNRECOVERABLE` when the
    device could not be recovered in this process. Logs go to server.log and control.log in the
    log directory (and to stderr when ``echo``). When work still ran on the device at the end,
    the process exits here (``os._exit``, socket and lock already removed): the device may still
    write host memory that Python's own exit would unmap under it.
    """
    configure_logging(options.log_directory, echo)
    stop = _Stop()
    hangup_r, hangup_w = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(hangup_w, False)  # the handler never blocks: one byte pending is enough
    _install_signals(stop, hangup_w)
    try:
        status = _serve(options, stop, hangup_r)
    except (LibshareError, OSError) as exc:
        log.error("%s", exc)
        control_log.error("arbiter pid %d did not start: %s", os.getpid(), exc)
        if not echo:
            print(exc, file=sys.stderr, flush=True)
        return EXIT_CANNOT_START
    finally:
        _close_logging()
    if stop.abandoned:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def _serve(options: Options, stop: _Stop, hangup: int) -> int:
    settings = _settings.read(options.config) if options.config is not None else {}  # a bad file: no start
    directory = options.pipe_directory
    prepare_directory(directory, options.multi_user)
    link = SupervisorLink(options.supervisor_fd) if options.supervisor_fd >= 0 else None
    arbiter = None
    if link is not None:  # a standby: the device first, then the lock on the control daemon's word
        arbiter = _make_arbiter(options, settings)
        link.send("standby")
        if not link.wait_for_go(stop):
            log.info("standby arbiter pid %d stops (%s)", os.getpid(), stop.reason or "the control daemon left")
            arbiter.close(0.0)
            return 0
    try:
        lock = PidLock(_config.lock_path(directory), directory)
    except BaseException:
        if arbiter is not None:
            arbiter.close(0.0)
        raise
    try:
        path = _config.socket_path(directory)
        remove_stale_socket(path, directory)
        from libshare.arbiter.drain import emergency as _emergency

        _emergency.install(path, lock.path)
        try:
            return _serve_locked(options, path, stop, arbiter, link, lock, settings, hangup)
        finally:
            _emergency.disarm()
    finally:
        lock.release()


def _make_arbiter(options: Options, settings: _settings.Values):
    from libshare.arbiter.serve.server import Arbiter  # imports Vulkan

    control_log.info("arbiter pid %d starting on %s%s", os.getpid(), options.pipe_directory,
                     " (standby of the control daemon)" if options.supervisor_fd >= 0 else "")
    _refuse_snooping()  # before any client's memory exists here
    oom_score_adj = _protect_from_oom()
    _share_shader_cache(options.pipe_directory)
    max_clients = options.max_clients or settings.get(("", "max_clients"))
    arbiter = Arbiter(options.device, timed=options.timestamps, multi_user=options.multi_user,
                      place_threads=options.placement,
                      **({"max_clients": max_clients} if max_clients else {}))
    if oom_score_adj > _OOM_SCORE_ADJ:
        arbiter.client_oom_score_adj = min(oom_score_adj + _CLIENT_OOM_MARGIN, 1000)
    if options.supervisor_fd >= 0:
        arbiter.prepare_to_serve()  # a standby starts its vetting compilers too, before it is needed
    return arbiter


def _serve_locked(options: Options, path: Path, stop: _Stop, arbiter, link: SupervisorLink | None,
                  lock: PidLock, settings: _settings.Values, hangup: int) -> int:
    standby = arbiter is not None
    if not standby:  # only once the lock says this process may serve
        arbiter = _make_arbiter(options, settings)
    metrics = None
    try:
        if options.config is not None:  # before the socket: the first client sees the file's settings
            arbiter.config.start(options.config, settings)
            if standby:  # it read the file when it started, maybe long ago
                _reload(arbiter, "taking over")
        _watch_signals(arbiter, hangup, stop)
        if options.metrics_port:  # before the socket: whoever sees the arbiter answer can scrape it
            from libshare.arbiter.serve.metrics import start_metrics

            metrics = start_metrics(arbiter, options.metrics_address, options.metrics_port)
            log.info("metrics at http://%s:%d/metrics", options.metrics_address, metrics.port)
        arbiter.drainer.recovery_timeout = options.shutdown_timeout
        _watch_quit(arbiter, stop)  # before the socket: a fault needs clients
        arbiter.supervised = link is not None  # the welcome tells the sessions (a container sees no lock)
        arbiter.serve(path)
        log.info("arbiter pid %d serving %s at %s", os.getpid(), arbiter.device.name, path)
        control_log.info("arbiter pid %d serving %s at %s", os.getpid(), arbiter.device.name, path)
        if link is not None:
            link.serve(arbiter, stop, lock)
        stop.event.wait()
    finally:
        if metrics is not None:
            metrics.close()
        unrecoverable = arbiter.drainer.unrecoverable
        if unrecoverable is not None:  # what runs has had its time already
            timeout = 0.0
        else:
            timeout = arbiter.quit_timeout if arbiter.quit_requested.is_set() else options.shutdown_timeout
        log.info("stopping (%s), work in flight gets %.1f s", stop.reason or "error", timeout)
        stop.abandoned = not arbiter.close(timeout)
    if unrecoverable is not None:
        log.error("arbiter pid %d exits with status %d: %s; start a new arbiter (a supervisor does: see README)",
                  os.getpid(), EXIT_UNRECOVERABLE, unrecoverable)
        control_log.error("arbiter pid %d stopped (%s): exit status %d", os.getpid(), stop.reason,
                          EXIT_UNRECOVERABLE)
        return EXIT_UNRECOVERABLE
    log.info("arbiter pid %d stopped", os.getpid())
    control_log.info("arbiter pid %d stopped (%s)", os.getpid(), stop.reason)
    return 0


class SupervisorLink:
    """An arbiter's end of its control daemon's socket pair (see _supervisor.py): lines both ways."""

    def __init__(self, fd: int):
        self._sock = socket.socket(fileno=fd)
        os.set_inheritable(fd, False)
        self._buffer = b""

    def send(self, word: str) -> None:
        """Tell the control daemon ``word`` (nothing happens when it is gone)."""
        try:
            self._sock.sendall(word.encode() + b"\n")
        except OSError:
            pass

    def _next_word(self, timeout: float | None) -> str | None:
        """The next line; "" at timeout, None once the daemon is gone."""
        while b"\n" not in self._buffer:
            self._sock.settimeout(timeout)
            try:
                data = self._sock.recv(256)
            except TimeoutError:
                return ""
            except OSError:
                return None
            if not data:
                return None
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode(errors="replace").strip()

    def wait_for_go(self, stop: _Stop) -> bool:
        """Wait (a standby) for ``go``; False when told to stop, or when the control daemon is gone."""
        while not stop.event.is_set():
            word = self._next_word(0.1)
            if word is None:
                return False
            if word == "go":
                return True
        return False

    def serve(self, arbiter, stop: _Stop, lock: PidLock) -> None:
        """Say ``active``, let ``restart`` reach the daemon, and hand over on its word."""
        arbiter.on_restart = lambda: self.send("restart")
        self.send("active")

        def watch():
            while True:
                word = self._next_word(None)
                if word is None:
                    return  # the control daemon is gone: serve on, unsupervised
                if word == "handover":
                    _hand_over(arbiter, stop, lock, self)
                    return

        threading.Thread(target=watch, name="libshare-supervisor-link", daemon=True).start()


def _hand_over(arbiter, stop: _Stop, lock: PidLock, link: SupervisorLink) -> None:
    """Let a new arbiter serve: stop accepting, give up socket and lock, move the clients, stop."""
    from libshare.arbiter.drain import emergency as _emergency

    arbiter.stop_accepting()
    _emergency.disarm()  # socket and lock are the new arbiter's from now on
    lock.release()
    link.send("released")
    control_log.info("arbiter pid %d handed the pipe directory over; its clients move to the new arbiter",
                     os.getpid())
    arbiter.move_clients()
    stop.set("handed over")


def _share_shader_cache(directory: Path) -> None:
    """Give the driver a shader cache in the pipe directory (unless the operator chose one).

    The vetting compiler children run each new kernel once, which on lavapipe fills Mesa's
    disk cache; the arbiter's own first dispatch of that kernel then loads the machine code
    instead of compiling it on the queue, in front of every client's work (_compiler.py).
    That needs a cache both can write: the default lives under $HOME, which a service may
    not have. The directory is the arbiter's own (mode 0700, inside the pipe directory).
    """
    if "MESA_SHADER_CACHE_DIR" in os.environ:
        return
    cache = directory / "shader-cache"
    try:
        cache.mkdir(mode=0o700, exist_ok=True)
        os.chmod(cache, 0o700)
    except OSError as exc:
        log.warning("no shader cache in %s (%s): a new kernel's first dispatch compiles on the queue", cache, exc)
        return
    os.environ["MESA_SHADER_CACHE_DIR"] = str(cache)


def _refuse_snooping() -> None:
    """Make this process non-dumpable, so that no other process of its uid can open its memfds."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_DUMPABLE, 0) failed (%s): processes of uid %d can open the buffers "
                    "this arbiter holds through /proc/%d/fd", os.strerror(ctypes.get_errno()), os.getuid(),
                    os.getpid())


def _protect_from_oom() -> int:
    """Set this process's oom_score_adj to -900 if allowed, else back to 0 if it inherited more;
    return the value it has now."""
    path = Path("/proc/self/oom_score_adj")
    try:
        path.write_text(str(_OOM_SCORE_ADJ))
    except OSError as exc:
        log.warning("cannot set the arbiter's oom_score_adj to %d (%s; that needs CAP_SYS_RESOURCE, or "
                    "OOMScoreAdjust= in the systemd unit): each client's is raised to %d above the "
                    "arbiter's instead", _OOM_SCORE_ADJ, exc.strerror, _CLIENT_OOM_MARGIN)
        if int(path.read_text()) > 0:  # raised in a parent (a client, say): lowering to 0 needs no privilege
            try:
                path.write_text("0")
            except OSError:
                pass  # a privileged parent set it higher on purpose
    return int(path.read_text())


# -------------------------------------------------------------------- background start

def _tail(path: Path, offset: int, lines: int = 8) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def _status(pipe_directory: Path, pid: int) -> str | None:
    """The state of the arbiter ``pid`` at ``pipe_directory``; None until it holds the lock and answers."""
    from libshare.protocol.control import ControlConnection  # light: no Vulkan

    try:
        if _config.lock_path(pipe_directory).read_text().strip() != str(pid):
            return None
        with ControlConnection(pipe_directory, timeout=5.0) as connection:
            if connection.run("get_server_list").split() != [str(pid)]:
                return None
            return connection.run("get_server_status").strip()
    except (ArbiterUnavailable, FileNotFoundError):
        return None


def _child_serving(pipe_directory: Path, parent: int) -> int | None:
    """The pid of the arbiter serving ``pipe_directory`` if it is a child of ``parent``."""
    pid = decimal(serving_pid(pipe_directory) or "", MAX_PID)
    return pid if pid and parent_of(pid) == parent else None


def start_background(options: Options, timeout: float = 60.0, supervised: bool = False) -> subprocess.Popen:
    """Start a detached arbiter and return once it answers ACTIVE; :class:`StartFailed` with its reason if not.

    The arbiter runs in a new session with stdin and stdout on /dev/null and stderr
    appended to ``arbiter.stderr`` in the log directory; it logs to server.log. With
    ``supervised`` the process started is the control daemon (_supervisor.py), whose child
    arbiter must answer ACTIVE.
    """
    options.log_directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    stderr_path = options.log_directory / STDERR_FILE
    with open(stderr_path, "ab") as stderr:
        offset = stderr.tell()
        process = subprocess.Popen([sys.executable, "-m", "libshare.arbiter", "--quiet",
                                    *(["--supervise"] if supervised else []), *options.argv()],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                   start_new_session=True, close_fds=True, cwd="/")
    try:
        _wait_active(process, options.pipe_directory, timeout, lambda: _tail(stderr_path, offset), supervised)
    except BaseException:
        if process.poll() is None:
            process.kill()
            process.wait()
        raise
    return process


def _wait_active(process: subprocess.Popen, pipe_directory: Path, timeout: float, reason,
                 supervised: bool = False) -> None:
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StartFailed(reason() or f"the arbiter exited with status {process.returncode}")
        try:
            pid = _child_serving(pipe_directory, process.pid) if supervised else process.pid
            status = None if pid is None else _status(pipe_directory, pid)
        except LibshareError as exc:
            status = f"unanswered ({exc})"
        if status == "ACTIVE":
            return
        if status == "FAULT":
            raise StartFailed(f"the arbiter (pid {process.pid}) is in FAULT state: {reason()}")
        time.sleep(0.02)
    raise StartFailed(f"the arbiter (pid {process.pid}) was not ACTIVE after {timeout:.0f} s "
                      f"(last status: {status}); {reason()}")
