"""Vetting compiles: a new module is compiled first in a child process, with a time limit.

Validation (``_admission.py``) rejects what SPIRV-Tools can see is wrong. It cannot see
what makes a particular driver's compiler crash or run for minutes on a *valid* module,
and on lavapipe that compiler runs inside the arbiter. So before the arbiter compiles a
module it has not compiled before, a short-lived child process with the same driver and
the same device compiles it:

* the child crashes (SIGSEGV in the driver): a fresh child tries once more (the first
  may have died of something else), and if it crashes too the module is refused; only
  children died;
* the child has used ``timeout`` seconds of CPU on the module (its user and system time, read
  from /proc while the arbiter waits) without answering, or has not answered after
  ``WALL_FACTOR`` times that on the clock (a child that sleeps, or that others' work on the
  cores keeps waiting): it is killed and the module refused, so no compile can take more of the
  device's driver than that. CPU time rather than the clock, because the clock counts the
  neighbours: llama.cpp's kernels (ggml's test-backend-ops MUL_MAT through the Vulkan driver,
  178 of them) took 2.8 s on the clock at the median and up to 11.5 s with two vetting children
  and the application's threads sharing two cores (a 10 s clock limit refused them). The default,
  300 s of CPU, lets through what llama.cpp compiles on lavapipe: its matrix multiplications take
  30-44 s each, its GET_ROWS kernels up to 118 s (the same compile the application pays at a
  kernel's first dispatch when it runs on lavapipe directly: its GET_ROWS tests took 252 s
  directly, 270 s through the driver). The child does not
  only create the pipeline: it runs it once (one workgroup, zeroed 4 KiB buffers, zero
  push constants), because llvmpipe compiles machine code at a kernel's first dispatch,
  and that compile would otherwise happen on the arbiter's queue, in front of every
  client's work. The trial fills Mesa's on-disk shader cache, which the arbiter's first
  dispatch then reads (0.01 s instead of 5.4 s for a kernel the helper built to compile
  slowly). A kernel that loops for longer than the limit over zeros is refused too;
* the child succeeds: the arbiter compiles the same module itself, off the thread that
  submits work (``device.create_pipeline`` may run on a connection thread), and the
  time that takes is bounded by what the child just took.

A child is a ``python -m libshare.arbiter.programs.compiler DEVICE`` process that opens the device
and then answers requests on its stdin/stdout: ``<len><bindings><push size><entry>``
then the module, answered by ``<status><len>`` and a message. Children are kept warm
(starting one costs a Python and a Vulkan start, about 0.3 s) and replaced after
``_RECYCLE_AFTER`` compiles, because lavapipe keeps about 105 KiB of every pipeline it
ever compiled (measured: 500 create/destroy pairs of one module grow a process by
54 MiB); a replaced child gives that memory back. At most ``_MAX_CHILDREN`` run at once,
so a client that keeps one busy for its whole time limit does not hold up another's.
Only the outcome is used: a pipeline cannot move between processes. A module that finds both
busy waits ``_QUEUE_WAIT`` at most, then its client is told to load it again later
(``Timeout``); so a vet answers within ``answer_bound`` seconds, which the arbiter's welcome
passes on to the client as its bound for ``load_program`` (a wait without one had no bound:
60 new modules at once, each at its time limit, took the last client past its own wait).

A module that passed is written down (its SHA-256, one line in ``vetted`` in the pipe
directory, at most ``_MAX_PASSED`` of them), and the arbiter that replaces this one after a
crash or a restart reads that list and does not vet them again: the sessions that reattach
load every program they hold at once, and a vetting trial per module (0.2 s each on
lavapipe) would be most of their pause. Only the arbiter's own uid (or root) can write the
pipe directory, and whoever can could kill the arbiter anyway; the list is read as hostile
all the same (bounded, and a line that is not a digest is skipped).

A daemon arbiter vets; an embedded one (one client, which can only hurt itself) does not.
With the test hooks on (LIBSHARE_TEST_HOOKS=1), a child crashes with SIGSEGV on a module
whose SHA-256 is listed in LIBSHARE_TEST_CRASH_COMPILES, so that tests can crash a real
compiler process on demand, and holds a module listed in LIBSHARE_TEST_HOLD_COMPILES
(``SHA256=FIFO``) until the test closes the FIFO, using no CPU meanwhile.
"""

from __future__ import annotations

import hashlib
import logging
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time

from libshare import settings as _settings
from libshare._proc import cpu_seconds
from libshare.errors import InvalidSubmission, ServerFault, Timeout
from libshare.protocol.texels import TEXEL_FORMATS, TEXEL_STORAGE, TEXEL_UNIFORM

log = logging.getLogger("libshare.arbiter")

__all__ = ["Compilers"]

_MAX_PASSED = 4096  # vetted modules written down for the next arbiter
_REQUEST = struct.Struct("<IIII")  # module bytes, bindings, push size, entry name bytes
_REPLY = struct.Struct("<iI")  # status (0 ok), message bytes
_READY = b"ready\n"
_START_TIMEOUT = 60.0
_RECYCLE_AFTER = 256
_MAX_CHILDREN = 2
WALL_FACTOR = 2  # a vet's clock limit: this many times its CPU limit
_QUEUE_WAIT = 60.0  # seconds a new module waits for a free vetting process before its client is told to retry
_TRIAL_BUFFER = 4096  # bytes of each buffer bound for the trial dispatch


class _Child:
    """One vetting process, used by one thread at a time."""

    def __init__(self, selector: str, cores: frozenset[int]):
        env = {**os.environ, _settings.SETTINGS["device"].env: selector,  # and this process's modules,
               "PYTHONPATH": os.pathsep.join(path for path in sys.path if path),  # wherever it runs
               _settings.SETTINGS["compiler_cores"].env: ",".join(map(str, sorted(cores)))}
        self.process = subprocess.Popen([_python(), "-c", _CHILD_MAIN],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        env=env, start_new_session=True)
        self.compiles = 0
        self.ready = False

    def send(self, spirv: bytes, bindings: int, push_size: int, entry: str) -> bool:
        """Hand the child a module; False when the child had died before it got it."""
        try:
            if not self.ready:
                self._read(len(_READY), time.monotonic() + _START_TIMEOUT, "starting")
                self.ready = True
            name = entry.encode()
            self.process.stdin.write(_REQUEST.pack(len(spirv), bindings, push_size, len(name)) + name + spirv)
            self.process.stdin.flush()
        except (OSError, _Dead, _TimedOut):
            return False
        return True

    def answer(self, cpu_limit: float) -> str | None:
        """None when the child compiled the module it was sent, else why not; raises _Dead, or _TimedOut once
        the child used ``cpu_limit`` seconds of CPU since it was sent the module, or WALL_FACTOR times that
        went by on the clock."""
        deadline = time.monotonic() + WALL_FACTOR * cpu_limit
        cpu_end = self._cpu() + cpu_limit
        status, length = _REPLY.unpack(self._read(_REPLY.size, deadline, "compiling", cpu_end))
        message = self._read(length, deadline, "compiling", cpu_end).decode(errors="replace")
        self.compiles += 1
        return None if status == 0 else message

    def _cpu(self) -> float:
        """The child's CPU seconds so far (infinite once it is gone: its death is read next)."""
        used = cpu_seconds(self.process.pid)
        return float("inf") if used is None else used

    def _read(self, count: int, deadline: float, doing: str, cpu_end: float = float("inf")) -> bytes:
        data = b""
        fd = self.process.stdout.fileno()
        while len(data) < count:
            # A single-threaded child uses at most a second of CPU a second: waiting what is left of its CPU
            # budget (or of the clock's, if sooner) cannot overshoot it by more than a look.
            left = min(deadline - time.monotonic(), max(cpu_end - self._cpu(), 0.0))
            readable = select.poll()  # not select(): the arbiter's fds run past FD_SETSIZE
            readable.register(fd, select.POLLIN)
            if not readable.poll(max(left, 0.0) * 1000):  # (a look, at least: a child that died is read so)
                if time.monotonic() < deadline and self._cpu() < cpu_end:
                    continue  # it waited for a core: its CPU budget is not spent
                raise _TimedOut(doing)
            chunk = os.read(fd, count - len(data))
            if not chunk:
                raise _Dead(self._death())
            data += chunk
        return data

    def _death(self) -> str:
        code = self.process.wait()
        return f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"

    def kill(self) -> None:
        """End the child now and reap it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()
            except OSError:  # the child died with a request half sent: nothing more to flush
                pass


_CHILD_MAIN = ("import site, sys, runpy\n"
               "for path in list(sys.path):\n"
               "    if path.endswith(('site-packages', 'dist-packages')):\n"
               "        site.addsitedir(path)\n"
               "runpy.run_module('libshare.arbiter.programs.compiler', run_name='__main__', alter_sys=True)\n")
"""A vetting child's main: the site directories on its PYTHONPATH are read as site directories (their
.pth files run, so an editable install's import hooks are there: a Python embedded in a C program
is not the virtual environment's interpreter), then this module runs."""


def _python() -> str:
    """A Python interpreter: this one, or (inside a C program that embeds Python) its installation's."""
    if "python" in os.path.basename(sys.executable):
        return sys.executable
    for candidate in (os.path.join(sys.prefix, "bin", "python3"), os.path.join(sys.base_prefix, "bin", "python3")):
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("python3") or "python3"


class _Dead(Exception):
    """The child died (the message says how)."""


class _TimedOut(Exception):
    """The child did not answer in time (the message says while doing what)."""


class Compilers:
    """A few warm vetting children, shared by the connection threads (thread-safe)."""

    def __init__(self, selector: str, timeout: float, cores: frozenset[int] | None = None):
        self.selector = selector
        self.cores = cores or frozenset(os.sched_getaffinity(0))
        """The cores the children run on: those the arbiter was given (see _take_arbiters_cores)."""
        self.timeout = timeout
        """CPU seconds a compile may take in a child before the module is refused (WALL_FACTOR times that on
        the clock)."""
        self._idle: list[_Child] = []
        self._running = 0
        self._closed = False
        self._lock = threading.Condition()
        self._passed: set[bytes] = set()  # digests of the modules that passed, here or before a restart
        self._passed_path: str | None = None

    def remember_passed(self, path) -> None:
        """Keep the digests of the modules that pass in the file ``path``, and trust those already there."""
        self._passed_path = str(path)
        try:
            with open(path, "rb") as file:
                text = file.read(_MAX_PASSED * 65)
        except OSError:
            return
        for line in text.split(b"\n")[:_MAX_PASSED]:
            try:
                digest = bytes.fromhex(line.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                continue
            if len(digest) == 32:
                self._passed.add(digest)

    def _passed_now(self, digest: bytes) -> None:
        if len(self._passed) >= _MAX_PASSED:
            return
        self._passed.add(digest)
        if self._passed_path is not None:
            try:
                fd = os.open(self._passed_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    os.write(fd, digest.hex().encode() + b"\n")
                finally:
                    os.close(fd)
            except OSError as exc:
                log.warning("could not note a vetted module in %s: %s", self._passed_path, exc)

    def vet(self, spirv: bytes, bindings: int, push_size: int, entry: str) -> None:
        """Compile the module in a child; raise InvalidSubmission if that crashes, fails or takes too long.

        A child can die of something else than the module (an operator's kill, the OOM
        killer), so a module is blamed only when a second, fresh child dies of it too. A module
        that passed before (here, or at the arbiter this one replaced) is not compiled again.
        """
        digest = hashlib.sha256(spirv).digest()
        if digest in self._passed:
            return
        child = self._take()
        try:
            for attempt in range(2):
                try:
                    if not child.send(spirv, bindings, push_size, entry):
                        raise _Dead("died before it was sent the module")
                    problem = child.answer(self.timeout)
                    break
                except _Dead as exc:
                    child.kill()
                    child = None
                    if attempt:
                        raise InvalidSubmission(f"compiling the program crashed the driver's compiler twice (the "
                                                f"vetting process {exc}); refused") from None
                    child = _Child(self.selector, self.cores)
        except _TimedOut:
            child.kill()
            child = None
            raise InvalidSubmission(f"compiling the program and running it once (one workgroup, zeroed buffers "
                                    f"and push constants) took more than {self.timeout:g} s of CPU (or "
                                    f"{WALL_FACTOR * self.timeout:g} s waiting); refused (the arbiter's "
                                    "LIBSHARE_COMPILE_TIMEOUT)") from None
        finally:
            self._give_back(child)
        if problem is not None:
            raise InvalidSubmission(f"the driver refused to compile the program: {problem}")
        self._passed_now(digest)

    def prestart(self) -> None:
        """Start one child now, so that the first new module does not wait for it."""
        with self._lock:
            if not self._closed and not self._idle and not self._running:
                self._idle.append(_Child(self.selector, self.cores))

    @property
    def answer_bound(self) -> float:
        """The most seconds :meth:`vet` takes: the wait for a free process, then the start and time limit
        of two processes (a second when the first died)."""
        return _QUEUE_WAIT + 2 * (_START_TIMEOUT + self.wall_limit)

    @property
    def wall_limit(self) -> float:
        """The most seconds on the clock one vetting compile takes (WALL_FACTOR times its CPU limit)."""
        return WALL_FACTOR * self.timeout

    def _take(self) -> _Child:
        with self._lock:
            if not self._lock.wait_for(lambda: self._closed or self._idle or self._running < _MAX_CHILDREN,
                                       timeout=_QUEUE_WAIT):
                raise Timeout(f"the arbiter's {_MAX_CHILDREN} vetting processes stayed busy with other new programs "
                              f"for {_QUEUE_WAIT:g} s; load this program again later")
            if self._closed:
                raise ServerFault("the arbiter is shutting down")
            self._running += 1
            if self._idle:
                return self._idle.pop()
        try:
            return _Child(self.selector, self.cores)
        except BaseException:
            self._give_back(None)
            raise

    def _give_back(self, child: _Child | None) -> None:
        if child is not None and (child.compiles >= _RECYCLE_AFTER or self._closed):
            child.kill()
            child = None
        with self._lock:
            self._running -= 1
            if child is not None:
                self._idle.append(child)
            self._lock.notify()

    def children(self) -> list[int]:
        """Pids of the idle children (for tests and the logs)."""
        with self._lock:
            return [child.process.pid for child in self._idle]

    def close(self) -> None:
        """Kill the idle children; busy ones are killed when their compile returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._lock.notify_all()
        for child in idle:
            child.kill()


def _serve() -> int:
    """The child: open the device, then compile and destroy one module per request."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    _take_arbiters_cores()
    with open("/proc/self/oom_score_adj", "w") as f:  # expendable: the OOM killer takes a compiler first
        f.write("1000")
    from libshare.arbiter.device import Device  # here, not at import: the parent must not load Vulkan for this module

    device = Device(_settings.value("device"))
    hooks = _settings.value("test_hooks")
    crash_on = _settings.value("test_crash_compiles") if hooks else frozenset()
    held = _settings.value("test_hold_compiles") if hooks else frozenset()
    hold_on = dict(word.split("=", 1) for word in held if "=" in word)
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    answers.write(_READY)
    answers.flush()
    while header := requests.read(_REQUEST.size):
        size, bindings, push_size, name_size = _REQUEST.unpack(header)
        entry = requests.read(name_size).decode(errors="replace")
        spirv = requests.read(size)
        digest = hashlib.sha256(spirv).hexdigest()
        if digest in crash_on:  # test hook: a compiler crash on demand
            os.kill(os.getpid(), signal.SIGSEGV)
        if digest in hold_on:  # test hook: a compile held, using no CPU, until the test closes the FIFO
            with open(hold_on[digest], "rb") as fifo:
                fifo.read()
        try:
            _trial(device, spirv, bindings, push_size, entry)
            status, message = 0, b""
        except Exception as exc:  # the driver's error, for the client
            status, message = 1, str(exc).encode()[:1000]
        answers.write(_REPLY.pack(status, len(message)) + message)
        answers.flush()
    device.close()
    return 0


def _take_arbiters_cores() -> None:
    """Run on the cores the arbiter was given, before the driver loads: the thread that started
    this child may run on fewer (_placement.py), and llvmpipe keys its shader cache by the
    number of cores it may use, so a trial run on one core filled a cache that the arbiter, which
    loaded the driver on two, never read (the slow-compile test's first dispatch compiled on
    the arbiter's queue again, for 2.4-4.1 s)."""
    try:
        cores = _settings.value("compiler_cores")
        if cores:
            os.sched_setaffinity(0, cores)
    except (OSError, ValueError):
        pass  # a compile on fewer cores is still a compile; only the cache misses


def _trial(device, spirv: bytes, bindings: int, push_size: int, entry: str) -> None:
    """Create the pipeline and run it once, on one workgroup over small zeroed buffers (at a texel buffer, a
    view of one, of a format the binding takes: :func:`_trial_view`).

    llvmpipe compiles a kernel's machine code at its first dispatch, not at pipeline
    creation, so only a dispatch shows what the compile costs. It also fills Mesa's
    on-disk shader cache, from which the arbiter's own first dispatch of the module then
    loads the machine code instead of compiling it (measured: 0.01 s instead of 5.4 s).
    """
    from libshare.arbiter.device import Dispatch

    pipeline = device.create_pipeline(spirv, bindings, push_size, entry)
    buffers = [device.alloc_device(_TRIAL_BUFFER) for _ in range(bindings)]
    views = {k: _trial_view(device, buffers[k], formats, k in pipeline.uniform) for k, formats in pipeline.texel.items()}
    try:
        bound = [(views[k], 0) if k in views else (b, 0) for k, b in enumerate(buffers)]
        submission = device.submit([Dispatch(pipeline, bound, (1, 1, 1), bytes(push_size))], timed=False)
        submission.wait()
        submission.release()
    finally:
        for view in views.values():
            device.destroy_view(view)
        for buffer in buffers:
            device.destroy_buffer(buffer)
        device.destroy_pipeline(pipeline)


def _trial_view(device, buffer, formats: tuple[str, ...], uniform: bool):
    """A view of the trial buffer for a texel binding: the first of its formats the device supports for its kind
    (admission made sure there is one)."""
    use = TEXEL_UNIFORM if uniform else TEXEL_STORAGE
    name = next(name for name in formats if device.texel_formats.get(name, 0) & use)
    texel = TEXEL_FORMATS[name]
    return device.create_view(buffer, texel.vk_format, 0, _TRIAL_BUFFER // texel.texel_bytes * texel.texel_bytes)


def _die_with_parent() -> None:
    """Exit as soon as the arbiter does, even in the middle of a compile.

    PR_SET_PDEATHSIG would fire when the *thread* that started the child ends (a
    connection thread), so a thread of the child watches a pidfd of its parent instead.
    """
    parent = os.pidfd_open(os.getppid())
    if os.getppid() == 1:  # the parent died before we looked
        os._exit(1)

    def watch() -> None:
        gone = select.poll()
        gone.register(parent, select.POLLIN)
        gone.poll()
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


if __name__ == "__main__":
    sys.exit(_serve())
