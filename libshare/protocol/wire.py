"""The control plane's wire format: versioned, length-prefixed frames on a Unix stream socket.

A frame is a 16-byte header (magic, version, JSON length, payload length), a JSON
object and an optional binary payload (SPIR-V). File descriptors travel beside the
frame's first bytes with SCM_RIGHTS.

The receiver trusts nothing it reads, and bounds everything before it allocates:

* **Two kinds of bad frame.** A bad magic or version, or a length past the bound,
  leaves the receiver unable to find the next frame: that is a :class:`ProtocolError`
  and the connection ends. A frame that arrived whole but whose content is unusable
  (JSON that does not parse, nests too deep, or is not an object; descriptors it
  should not carry) is a :class:`MalformedFrame`: the stream is still in step, so the
  arbiter answers it with an error and reads the next one.
* **Descriptors.** Each ``recvmsg`` offers the kernel room for exactly the descriptors
  the frame may carry (none, for every request a client sends). Descriptors past that
  room are never installed in the receiver: the kernel drops them and says so with
  MSG_CTRUNC. Any that do arrive beyond what is expected are closed at once, not at
  the end of the frame, so a peer that sends a frame a byte at a time with four
  descriptors on each byte costs the receiver nothing. Either way the frame is a
  MalformedFrame. No frame carries more than :data:`MAX_FDS`.
* **Time.** :func:`recv` may wait for a frame's first byte as long as the caller
  likes (a session idles between requests); once a frame has begun, its ``timeout``
  bounds how long the rest may take, so a peer that stops mid-frame cannot hold a
  reader for ever. :class:`FrameReader` reads a frame in steps from a non-blocking
  socket, for the arbiter's gate (``arbiter/serve/gate.py``), which holds every connection
  that has not said hello yet without a thread each.
* **Fields.** :func:`check_fields` validates a request's fields against a schema (type
  and range of each, unknown fields refused) before anything reads them; a value of the
  wrong type is refused, never hashed, compared or formatted in full.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import reprlib
import select
import socket
import struct
import time
from pathlib import Path

from libshare.protocol import paths as _config
from libshare import errors
from libshare.errors import (AccessDenied, ArbiterLost, ArbiterUnavailable, InvalidSubmission, LibshareError, ProtocolError)

__all__ = ["MAGIC", "VERSION", "MAX_FRAME", "MAX_FDS", "FIRST_FRAME", "dial", "send", "recv", "Frame",
           "FrameReader", "MalformedFrame", "check_fields", "text", "integer", "choice", "texts",
           "byte_counts", "either", "short", "error_reply"]

MAGIC = 0x4C53_4354  # "LSCT"
VERSION = 1
MAX_FRAME = 4 << 20  # 4 MiB: a large SPIR-V module fits, a hostile length does not
FIRST_FRAME = 64 << 10  # a hello or a control command: no payload, a small object
MAX_FDS = 4  # no frame carries more descriptors (the welcome carries 2, a shared alloc's reply 1)
_HEADER = struct.Struct("<IHHII")  # magic, version, reserved, json length, payload length
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps with these options makes an encoder per call
# The socket module's flags are enums, whose every ``&`` costs a microsecond: plain ints, per frame step.
_SOL_SOCKET, _SCM_RIGHTS = int(socket.SOL_SOCKET), int(socket.SCM_RIGHTS)
_MSG_CTRUNC, _MSG_CMSG_CLOEXEC = int(socket.MSG_CTRUNC), int(socket.MSG_CMSG_CLOEXEC)
_MSG_DONTWAIT = int(socket.MSG_DONTWAIT)


class MalformedFrame(ProtocolError):
    """A whole frame arrived but its content is unusable; the stream is still in step."""


_RESTART_PAUSE = 0.01  # seconds between looks for the arbiter a control daemon is starting


def peer_credentials(conn: socket.socket) -> tuple[int, int]:
    """The (pid, uid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid, uid


def trusted_uid(uid: int) -> bool:
    """Root or this process's own uid: in the arbiter, its operator (state-changing commands,
    every client's details, any priority or group); in a client, an arbiter it may trust."""
    return uid == 0 or uid == os.getuid()


def _check_server_uid(sock: socket.socket, path: Path) -> None:
    """AccessDenied (the socket closed) unless the process listening at ``path`` runs as root or
    as this user. The default pipe directory lies in /tmp under a name anyone can guess: another
    user who made it first, and listened there, got this user's buffers and programs. (An arbiter
    of another user than root would refuse this one anyway: only root's serves other users.)"""
    uid = peer_credentials(sock)[1]
    if not trusted_uid(uid):
        sock.close()
        raise AccessDenied(f"the process listening at {path} runs as uid {uid}, neither this user's "
                           f"({os.getuid()}) nor root's: it is not an arbiter this user may trust with its data "
                           "(set LIBSHARE_PIPE_DIRECTORY to your arbiter's directory)")


_SUN_PATH = 100  # bytes of a Unix socket's path that every kernel takes (sun_path holds 108 with its NUL)


@contextlib.contextmanager
def unix_address(path: Path):
    """The address to bind or connect ``path`` by: the path itself, or, when it is too long for a
    Unix socket's address (a share socket under a deep directory), the same file reached through
    a descriptor of its directory (``/proc/self/fd/N/NAME``), open for the block."""
    path = Path(path)
    if len(os.fsencode(str(path))) <= _SUN_PATH:
        yield str(path)
        return
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{directory}/{path.name}"
    finally:
        os.close(directory)


def dial(path: Path, timeout: float) -> socket.socket | None:
    """A stream connected to the arbiter's socket at ``path``, or None when no arbiter listens there.

    A full listen queue (a burst of clients connecting at once) answers EAGAIN at once on a
    Unix socket; that is retried until ``timeout`` seconds have passed, then ArbiterUnavailable.
    While a control daemon supervises the directory, no arbiter listening means that a new
    one is on its way (a crash, a restart): that is waited for too, within ``timeout``.
    A socket (or directory) this user may not open is :class:`AccessDenied`, and so is a listener
    of another uid than this user's and root's (:func:`_check_server_uid`).
    """
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(timeout)
        try:
            with unix_address(path) as address:
                sock.connect(address)
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
            sock.close()
            if time.monotonic() + _RESTART_PAUSE > deadline or not _config.supervised(Path(path).parent):
                return None
            time.sleep(_RESTART_PAUSE)
        except PermissionError as exc:
            sock.close()
            raise AccessDenied(f"uid {os.getuid()} may not connect to the arbiter at {path} ({exc.strerror}): "
                               "an arbiter serves only its own user unless it was started with "
                               "--multi-user (as root)") from None
        except BlockingIOError:
            sock.close()
            if time.monotonic() + pause > deadline:
                raise ArbiterUnavailable(f"the arbiter at {path} did not take the connection within "
                                         f"{timeout:g} s (its listen queue stayed full)") from None
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
        except BaseException:
            sock.close()
            raise
        else:
            _check_server_uid(sock, path)
            return sock


class Frame:
    """One received message: its JSON fields, its payload bytes and its file descriptors."""

    __slots__ = ("fields", "payload", "fds")

    def __init__(self, fields: dict, payload: bytes, fds: list[int]):
        self.fields = fields
        """The JSON object."""
        self.payload = payload
        """Binary payload (empty when none)."""
        self.fds = fds
        """File descriptors received with it; the receiver owns them."""

    def close_fds(self) -> None:
        """Close every descriptor that came with the frame."""
        _close_all(self.fds)
        self.fds = []


def encode(fields: dict, payload: bytes = b"") -> bytes:
    """One frame's bytes: its header, ``fields`` as JSON, then ``payload``."""
    body = _ENCODE(fields).encode()
    if len(body) + len(payload) > MAX_FRAME:
        raise ProtocolError(f"message of {len(body) + len(payload)} bytes exceeds {MAX_FRAME}")
    return _HEADER.pack(MAGIC, VERSION, 0, len(body), len(payload)) + body + payload


def send(sock: socket.socket, fields: dict, payload: bytes = b"", fds: tuple[int, ...] = ()) -> None:
    """Send one frame (and ``fds`` with it)."""
    if len(fds) > MAX_FDS:
        raise ProtocolError(f"a frame carries at most {MAX_FDS} file descriptors (got {len(fds)})")
    frame = encode(fields, payload)
    try:
        if fds:
            sent = sock.sendmsg([frame], [(_SOL_SOCKET, _SCM_RIGHTS, array.array("i", fds))])
            if sent < len(frame):  # (sendall of nothing would still make a system call)
                sock.sendall(frame[sent:])
        else:
            sock.sendall(frame)
    except (BrokenPipeError, ConnectionResetError) as exc:
        raise ArbiterLost(f"the peer closed the control socket: {exc}") from exc


class FrameReader:
    """Reads one frame at a time, in as many steps as the socket needs.

    :meth:`step` makes one ``recvmsg`` for what the frame still lacks (never more, so the
    bytes of the next frame stay in the socket) and returns the frame once it is whole.
    ``max_fds`` descriptors may come with a frame, ``max_frame`` bytes of JSON and payload.
    """

    __slots__ = ("max_fds", "max_frame", "_room", "_buffer", "_need", "_json_len", "_fds", "_refused")

    def __init__(self, max_fds: int = 0, max_frame: int = MAX_FRAME):
        self.max_fds = max_fds
        self.max_frame = max_frame
        self._room = socket.CMSG_SPACE(max_fds * 4) if max_fds else 0
        self._reset()

    def _reset(self) -> None:
        self._buffer = bytearray()
        self._need = _HEADER.size
        self._json_len = -1  # -1 until the header is read
        self._fds: list[int] = []
        self._refused = 0

    @property
    def started(self) -> bool:
        """True once a byte of the current frame has arrived."""
        return bool(self._buffer) or self._json_len >= 0

    def step(self, sock: socket.socket, extra_flags: int = 0) -> Frame | None:
        """Read once (``recvmsg``, with ``extra_flags``); the frame when it is complete, else None.

        Raises what ``recvmsg`` raises (BlockingIOError when a non-blocking socket has
        nothing, or with MSG_DONTWAIT), EOFError when the peer closed, ProtocolError when the
        stream cannot be followed any more, MalformedFrame for a whole frame whose content is bad.
        """
        data, ancillary, flags, _ = sock.recvmsg(self._need - len(self._buffer), self._room,
                                                 _MSG_CMSG_CLOEXEC | extra_flags)
        self._take_fds(ancillary, flags)
        if not data:
            started = self.started
            self.close()
            raise EOFError("control socket closed" + (" in the middle of a frame" if started else ""))
        self._buffer += data
        if len(self._buffer) < self._need:
            return None
        if self._json_len < 0:
            magic, version, _reserved, json_len, payload_len = _HEADER.unpack(self._buffer)
            if magic != MAGIC or version != VERSION:
                self.close()
                raise ProtocolError(f"bad frame header (magic {magic:#x}, version {version}); expected "
                                    f"{MAGIC:#x} version {VERSION}")
            if json_len + payload_len > self.max_frame:
                self.close()
                raise ProtocolError(f"frame of {json_len + payload_len} bytes exceeds the "
                                    f"{self.max_frame}-byte bound")
            self._json_len, self._need = json_len, json_len + payload_len
            self._buffer = bytearray()
            if self._need:
                return None
        return self._finish()

    def _take_fds(self, ancillary, flags: int) -> None:
        for level, kind, blob in ancillary:
            if level != _SOL_SOCKET or kind != _SCM_RIGHTS:
                continue
            received = array.array("i")
            received.frombytes(blob[: len(blob) - len(blob) % received.itemsize])
            for fd in received:
                if len(self._fds) < self.max_fds and not self._refused:
                    self._fds.append(fd)
                else:  # never kept: a peer cannot make us hold descriptors it sends unasked
                    os.close(fd)
                    self._refused += 1
        if flags & _MSG_CTRUNC:  # the kernel dropped descriptors that found no room
            self._refused += 1

    def _finish(self) -> Frame:
        body, json_len, fds, refused = bytes(self._buffer), self._json_len, self._fds, self._refused
        self._fds = []
        self._reset()
        try:
            if refused:
                raise MalformedFrame(f"the frame carried more file descriptors than the {self.max_fds} "
                                     "it may; they were closed")
            try:
                fields = json.loads(body[:json_len]) if json_len else {}
            except RecursionError:
                raise MalformedFrame("frame body nests too deep") from None
            except (ValueError, UnicodeDecodeError) as exc:
                raise MalformedFrame(f"undecodable frame: {str(exc)[:200]}") from None
            if not isinstance(fields, dict):
                raise MalformedFrame(f"frame body is a JSON {type(fields).__name__}, not an object")
        except BaseException:
            _close_all(fds)
            raise
        return Frame(fields, body[json_len:], fds)

    def close(self) -> None:
        """Close the descriptors of a frame not yet complete, and start over."""
        _close_all(self._fds)
        self._reset()


def poll_briefly(poller: select.poll, seconds: float) -> None:
    """Look at ``poller`` (one socket, registered for reading) until it reports the socket or
    ``seconds`` pass, yielding the core at each look: a peer about to sleep in ``recv`` keeps its
    core awake for a moment first. An idle core halts, and waking it again cost a 2-core VM tens of
    microseconds per message (the arbiter's session threads and the clients' requests do this)."""
    end = time.perf_counter() + seconds
    while not poller.poll(0) and time.perf_counter() < end:
        os.sched_yield()


def recv(sock: socket.socket, max_fds: int = 0, timeout: float | None = None,
         max_frame: int = MAX_FRAME) -> Frame:
    """Receive one frame; raise EOFError on a close, ProtocolError on a bad frame (MalformedFrame
    when the stream is still in step).

    The first byte is waited for as the socket's own timeout says; ``timeout``, when given,
    bounds the time the rest of the frame may take after it (ProtocolError past it).
    """
    reader = FrameReader(max_fds, max_frame)
    original = sock.gettimeout()
    try:
        frame = reader.step(sock)
        if frame is not None:
            return frame
        if timeout is not None and original is None:  # the rest usually came with the header: read it
            try:  # without the two timeout changes (four system calls) that bound a wait for it
                frame = reader.step(sock, _MSG_DONTWAIT)
                if frame is not None:
                    return frame
            except BlockingIOError:
                pass
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ProtocolError(f"a frame was begun and not finished within {timeout:g} s")
                sock.settimeout(left if original is None else min(left, original))
            try:
                frame = reader.step(sock)
            except TimeoutError:
                if deadline is None or time.monotonic() < deadline:
                    raise
                raise ProtocolError(f"a frame was begun and not finished within {timeout:g} s") from None
            if frame is not None:
                return frame
    finally:
        reader.close()
        if sock.gettimeout() != original:
            sock.settimeout(original)


def error_reply(exc: BaseException) -> dict:
    """``{"ok": false, "error": CLASS, "message": TEXT}``: the reply that refuses a request with ``exc``.

    CLASS is the public libshare class the peer raises (a private subclass such as
    :class:`MalformedFrame` is named by its public base); the message is bounded.
    """
    name = "ProtocolError"
    for cls in type(exc).__mro__:
        if getattr(errors, cls.__name__, None) is cls and issubclass(cls, LibshareError):
            name = cls.__name__
            break
    return {"ok": False, "error": name, "message": str(exc)[:4096]}


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


# -------------------------------------------------------------------- schemas

_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 40, 40, 40
_SHORT.maxlist = _SHORT.maxdict = _SHORT.maxtuple = 4
_SHORT.maxlevel = 3


def short(value) -> str:
    """A repr of an untrusted value that stays short however large or deep the value is."""
    try:
        return _SHORT.repr(value)
    except (RecursionError, ValueError):
        return f"<{type(value).__name__}>"


def text(max_len: int):
    """A rule: a string of at most ``max_len`` characters."""
    def rule(name: str, value):
        if not isinstance(value, str) or len(value) > max_len:
            raise InvalidSubmission(f"{name} must be a string of at most {max_len} characters (got {short(value)})")
        return value
    return rule


def integer(low: int, high: int):
    """A rule: an integer (not a bool) in ``low..high``."""
    def rule(name: str, value):
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise InvalidSubmission(f"{name} must be an integer in {low}..{high} (got {short(value)})")
        return value
    return rule


def flag():
    """A rule: true or false (a JSON boolean, not a number)."""
    def rule(name: str, value):
        if not isinstance(value, bool):
            raise InvalidSubmission(f"{name} must be true or false (got {short(value)})")
        return value
    return rule


def choice(*values: str):
    """A rule: one of ``values`` (strings)."""
    def rule(name: str, value):
        if not isinstance(value, str) or value not in values:
            raise InvalidSubmission(f"{name} must be one of {', '.join(map(repr, values))} (got {short(value)})")
        return value
    return rule


def texts(max_items: int, max_len: int):
    """A rule: a list of at most ``max_items`` strings of at most ``max_len`` characters each."""
    def rule(name: str, value):
        if (not isinstance(value, list) or len(value) > max_items
                or not all(isinstance(item, str) and len(item) <= max_len for item in value)):
            raise InvalidSubmission(f"{name} must be a list of at most {max_items} strings of at most "
                                    f"{max_len} characters (got {short(value)})")
        return value
    return rule


def byte_counts(max_items: int, max_key: int, high: int):
    """A rule: an object of at most ``max_items`` string keys to integers in 0..``high``."""
    def rule(name: str, value):
        if (not isinstance(value, dict) or len(value) > max_items
                or not all(isinstance(k, str) and len(k) <= max_key and isinstance(v, int)
                           and not isinstance(v, bool) and 0 <= v <= high for k, v in value.items())):
            raise InvalidSubmission(f"{name} must map at most {max_items} device names to byte counts "
                                    f"(got {short(value)})")
        return value
    return rule


def either(*rules):
    """A rule: whatever one of ``rules`` accepts, tried in order (the first one's refusal otherwise)."""
    def rule(name: str, value):
        refusal = None
        for candidate in rules:
            try:
                return candidate(name, value)
            except InvalidSubmission as exc:
                refusal = refusal or exc
        raise refusal
    return rule


def check_fields(fields: dict, schema: dict, what: str) -> dict:
    """``fields`` checked against ``schema`` ({name: (rule, required)}); unknown fields are refused.

    Returns ``fields``. A missing or unknown field is a ProtocolError, a value of the wrong
    type or out of range an InvalidSubmission; either names the field.
    """
    unknown = [name for name in fields if name not in schema]
    if unknown:
        raise ProtocolError(f"{what}: unknown field {short(unknown[0])}; the fields are {', '.join(schema)}")
    for name, (rule, required) in schema.items():
        if name in fields:
            rule(f"{what}: {name}", fields[name])
        elif required:
            raise ProtocolError(f"{what}: the field {name!r} is missing")
    return fields
