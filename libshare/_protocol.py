"""The control plane's wire format: versioned, length-prefixed frames on a Unix stream socket.

A frame is a 16-byte header (magic, version, payload length, JSON length), a
JSON object and an optional binary payload (SPIR-V). File descriptors travel
beside the frame's first bytes with SCM_RIGHTS. The receiver bounds everything
before it allocates: a frame longer than MAX_FRAME, a bad magic or version,
JSON that is not an object, or more descriptors than expected is a
:class:`ProtocolError`, and descriptors that arrive unasked are closed at once
so a peer cannot make us leak them.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
import time
from pathlib import Path

from .errors import ArbiterLost, ArbiterUnavailable, ProtocolError

__all__ = ["MAGIC", "VERSION", "MAX_FRAME", "dial", "send", "recv", "Frame"]

MAGIC = 0x4C53_4354  # "LSCT"
VERSION = 1
MAX_FRAME = 4 << 20  # 4 MiB: a large SPIR-V module fits, a hostile length does not
MAX_FDS = 4
_HEADER = struct.Struct("<IHHII")  # magic, version, reserved, json length, payload length


def dial(path: Path, timeout: float) -> socket.socket | None:
    """A stream connected to the arbiter's socket at ``path``, or None when no arbiter listens there.

    A full listen queue (a burst of clients connecting at once) answers EAGAIN at once on a
    Unix socket; that is retried until ``timeout`` seconds have passed, then ArbiterUnavailable.
    """
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
            return sock
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
            sock.close()
            return None
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
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def send(sock: socket.socket, fields: dict, payload: bytes = b"", fds: tuple[int, ...] = ()) -> None:
    """Send one frame (and ``fds`` with it)."""
    body = json.dumps(fields, separators=(",", ":")).encode()
    if len(body) + len(payload) > MAX_FRAME:
        raise ProtocolError(f"message of {len(body) + len(payload)} bytes exceeds {MAX_FRAME}")
    frame = _HEADER.pack(MAGIC, VERSION, 0, len(body), len(payload)) + body + payload
    try:
        sent = 0
        if fds:
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
            sent = sock.sendmsg([frame], ancillary)
        sock.sendall(frame[sent:])
    except (BrokenPipeError, ConnectionResetError) as exc:
        raise ArbiterLost(f"the peer closed the control socket: {exc}") from exc


def _recv_exact(sock: socket.socket, count: int, fds: list[int]) -> bytes:
    chunks, got = [], 0
    while got < count:
        data, ancillary, _flags, _addr = sock.recvmsg(count - got, socket.CMSG_SPACE(MAX_FDS * 4))
        for level, kind, blob in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received = array.array("i")
                received.frombytes(blob[: len(blob) - len(blob) % 4])
                fds.extend(received)
        if not data:
            raise EOFError("control socket closed")
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


def recv(sock: socket.socket, max_fds: int = 0) -> Frame:
    """Receive one frame; raise EOFError on a clean close, ProtocolError on a bad frame."""
    fds: list[int] = []
    try:
        header = _recv_exact(sock, _HEADER.size, fds)
        magic, version, _reserved, json_len, payload_len = _HEADER.unpack(header)
        if magic != MAGIC or version != VERSION:
            raise ProtocolError(f"bad frame header (magic {magic:#x}, version {version}); expected "
                                f"{MAGIC:#x} version {VERSION}")
        if json_len + payload_len > MAX_FRAME:
            raise ProtocolError(f"frame of {json_len + payload_len} bytes exceeds the {MAX_FRAME}-byte bound")
        body = _recv_exact(sock, json_len + payload_len, fds)
        if len(fds) > max_fds:
            raise ProtocolError(f"peer sent {len(fds)} file descriptors, at most {max_fds} expected")
        fields = json.loads(body[:json_len]) if json_len else {}
        if not isinstance(fields, dict):
            raise ProtocolError("frame body is not a JSON object")
        return Frame(fields, body[json_len:], fds)
    except (ValueError, UnicodeDecodeError) as exc:
        _close_all(fds)
        raise ProtocolError(f"undecodable frame: {exc}") from exc
    except BaseException:
        _close_all(fds)
        raise


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
