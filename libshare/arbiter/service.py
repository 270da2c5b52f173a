"""Running the arbiter as a service: the foreground runner, signals, and the control daemon's link.

:func:`run` is the runner behind ``python -m libshare.arbiter`` (``libshare-control -f``
runs the control daemon, which starts it). It takes the pipe directory's lock
(:mod:`libshare.daemon.directory`), removes a stale socket, logs to server.log and
control.log (:mod:`libshare.daemon.logs`), and serves until SIGINT, SIGTERM, ``quit`` or a
device that cannot be recovered. SIGINT and SIGTERM stop gracefully through
:meth:`Arbiter.close`; a crash signal runs the C handler of ``drain/emergency.c``, which
unlinks socket and lock before the process dies. Starting one in the background is
:mod:`libshare.daemon.start`.

Under the control daemon (``--supervisor-fd``) an arbiter starts as a standby: it makes
its device and vetting compilers first, says ``standby`` on its link, and takes the lock
only on ``go`` (:class:`SupervisorLink`). Serving, it says ``active``; ``restart`` reaches
the daemon through it, and ``handover`` makes it stop accepting, give up socket and lock
(its crash handler disarmed: they are the new arbiter's), say ``released`` and move its
clients (:func:`_hand_over`), then finish the work they wait for (a long dispatch goes on
piece by piece, each under the watchdog, so the other clients' work is never queued behind
its whole rest) and stop as after ``quit``. A device that gets stuck while a standby waits
(a runaway dispatch, a lost device) ends the process at once instead (:func:`_end_at_once`).
A link that closes means the control daemon is gone: the arbiter serves on, unsupervised
(:func:`_unsupervised`), until a new control daemon adopts it.

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

import ctypes
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from libshare import settings as _settings
from libshare.protocol import paths as _config
from libshare.daemon import config_file as _config_file
from libshare.daemon.directory import PidLock, prepare_directory, remove_stale_socket
from libshare.daemon.logs import close_logging as _close_logging, configure_logging
from libshare.daemon.options import EXIT_CANNOT_START, EXIT_UNRECOVERABLE, Options
from libshare.errors import LibshareError

__all__ = ["run", "SupervisorLink"]

log = logging.getLogger("libshare.arbiter")
control_log = logging.getLogger("libshare.control")

_OOM_SCORE_ADJ = -900  # the daemon arbiter's, where it may lower it
_CLIENT_OOM_MARGIN = 500  # otherwise clients are kept this far above the arbiter
_PR_SET_DUMPABLE = 4


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
    """Read the configuration file again; a bad one is logged (by Config.reload) and changes nothing.
    Any other failure is logged too: the signal thread outlives it and acts on the next SIGHUP."""
    try:
        arbiter.config.reload(why)
    except LibshareError:
        pass
    except Exception:
        control_log.exception("configuration not reloaded (%s); the next SIGHUP reads the file again", why)


def _watch_quit(arbiter, stop: _Stop) -> None:
    """Stop on the quit command, and when the control thread gives the device up."""
    def watch():
        arbiter.quit_requested.wait()
        stop.set("quit command")

    arbiter.drainer.containment.on_unrecoverable = lambda why: stop.set("the device cannot be recovered")
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
    settings = _config_file.read(options.config) if options.config is not None else {}  # a bad file: no start
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


def _make_arbiter(options: Options, settings: _config_file.Values):
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
                  lock: PidLock, settings: _config_file.Values, hangup: int) -> int:
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
        arbiter.drainer.containment.recovery_timeout = options.shutdown_timeout
        _watch_quit(arbiter, stop)  # before the socket: a fault needs clients
        arbiter.on_hand_over = lambda: threading.Thread(target=_hand_over, args=(arbiter, stop, lock, link),
                                                        name="libshare-hand-over", daemon=True).start()
        if link is not None:  # a standby waits: a stuck device costs the sessions a reattach, not a FAULT
            arbiter.drainer.containment.on_stuck = lambda why: _end_at_once(why, path)
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
        unrecoverable = arbiter.drainer.containment.unrecoverable
        if unrecoverable is not None:  # what runs has had its time already
            timeout = 0.0
        else:
            timeout = arbiter.quit_timeout if arbiter.quit_requested.is_set() else options.shutdown_timeout
        log.info("stopping (%s), work in flight gets %.1f s", stop.reason or "error", timeout)
        stop.abandoned = not arbiter.close(timeout)
    if unrecoverable is not None:
        log.error("arbiter pid %d exits with status %d: %s; start a new arbiter (a supervisor does: see docs/operating.md)",
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
                    _unsupervised(arbiter)
                    return
                if word == "handover":
                    _hand_over(arbiter, stop, lock, self)
                    return

        threading.Thread(target=watch, name="libshare-supervisor-link", daemon=True).start()


def _unsupervised(arbiter) -> None:
    """The control daemon is gone: serve on, but promise nothing only it could keep (a restart, a
    standby to hand a stuck device to, a new arbiter for the sessions to wait for) until a new
    control daemon adopts this arbiter (``adopt``: libshare/daemon/supervisor.py)."""
    control_log.warning("arbiter pid %d: its control daemon is gone; it serves on unsupervised until "
                        "libshare-control -d (or -f) adopts it", os.getpid())
    arbiter.on_restart = None
    arbiter.supervised = False
    arbiter.drainer.containment.on_stuck = None


def _end_at_once(why: str, socket_path: Path) -> None:
    """End this process now, its device stuck (see "Handing over at once" in drain/containment.py):
    the kernel ends the work Vulkan cannot abort, the lock goes with the process, the control
    daemon's standby takes over, and the sessions reattach to it."""
    message = (f"arbiter pid {os.getpid()} ends now ({why}); the control daemon's standby takes over "
               "and every session reattaches to it")
    log.error("%s", message)
    control_log.error("%s", message)
    socket_path.unlink(missing_ok=True)  # (the lock is released by the kernel at exit)
    _close_logging()
    os._exit(EXIT_UNRECOVERABLE)


def _hand_over(arbiter, stop: _Stop, lock: PidLock, link: SupervisorLink | None) -> None:
    """Let a new arbiter serve: stop accepting, give up socket and lock, move the clients, finish
    what they wait for, stop. ``link``: the control daemon's, told ``released`` (None: a new
    control daemon adopting this arbiter watches the lock)."""
    from libshare.arbiter.drain import emergency as _emergency

    arbiter.stop_accepting()
    _emergency.disarm()  # socket and lock are the new arbiter's from now on
    lock.release()
    if link is not None:
        link.send("released")
    control_log.info("arbiter pid %d handed the pipe directory over; its clients move to the new arbiter",
                     os.getpid())
    arbiter.move_clients()
    if not arbiter.finish_moved_work(arbiter.moved_work_bound()):  # their sessions wait for it
        control_log.warning("arbiter pid %d: the moved clients' work still ran after %.0f s; it stops now",
                            os.getpid(), arbiter.moved_work_bound())
    stop.set("handed over")


def _share_shader_cache(directory: Path) -> None:
    """Give the driver a shader cache in the pipe directory (unless the operator chose one).

    The vetting compiler children run each new kernel once, which on lavapipe fills Mesa's
    disk cache; the arbiter's own first dispatch of that kernel then loads the machine code
    instead of compiling it on the queue, in front of every client's work (_compiler.py).
    That needs a cache both can write: the default lives under $HOME, which a service may
    not have. The directory is the arbiter's own (mode 0700, inside the pipe directory).

    The cache is bounded by the setting ``shader_cache_max_size`` (Mesa's own eviction, which
    removes least recently used entries once a new one would pass the bound; the vetting children
    inherit it), unless the operator set MESA_SHADER_CACHE_MAX_SIZE. Mesa reads a size without a
    unit as gigabytes: it is given in KiB.
    """
    os.environ.setdefault("MESA_SHADER_CACHE_MAX_SIZE", f"{_settings.value('shader_cache_max_size') // 1024}K")
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
