"""The libshare exception family.

Every error libshare raises derives from :class:`LibshareError`. Where a builtin
exception means the same thing, the libshare class also derives from it (the
pynacl pattern), so ``except TimeoutError`` and ``except libshare.Timeout`` both
work. Each message says what went wrong and what to do about it.
"""

from __future__ import annotations

import builtins

__all__ = [
    "LibshareError",
    "ArbiterUnavailable",
    "ArbiterLost",
    "ArbiterRestarted",
    "BufferLost",
    "ServerNotReady",
    "AccessDenied",
    "Quarantined",
    "QuotaExceeded",
    "TooManyClients",
    "ClientTerminated",
    "SessionClosed",
    "InvalidSubmission",
    "ServerFault",
    "ProtocolError",
    "RingCorrupted",
    "RingFull",
    "Timeout",
    "VulkanUnavailable",
]


class LibshareError(Exception):
    """Root of every error libshare raises."""


class ArbiterUnavailable(builtins.ConnectionError, LibshareError):
    """No arbiter answers at the pipe directory (and the mode forbids embedding)."""


class ArbiterLost(builtins.ConnectionError, LibshareError):
    """The arbiter this session was attached to died or closed the connection."""


class ArbiterRestarted(ArbiterLost):
    """The arbiter went away while this ticket's work was in flight, and a control daemon starts
    (or has started) a new one: the work may or may not have run. Submit it again; the session
    reattaches by itself, with the same arrays and programs."""


class BufferLost(LibshareError):
    """A device-local buffer whose contents died with the arbiter that held them (sticky for
    that buffer); shared buffers survive an arbiter restart, device ones do not."""


class ServerNotReady(ArbiterUnavailable):
    """The arbiter is in FAULT or INITIALIZING and takes no new clients; retry once it is ACTIVE."""


class AccessDenied(builtins.PermissionError, LibshareError):
    """The arbiter refused this user (another uid, or a state-changing command from a non-owner)."""


class Quarantined(AccessDenied):
    """The arbiter refuses this client process, or this SPIR-V module for every client: it was under
    way when the arbiter died, twice (a compile, a runaway dispatch). The message says what happened
    and how an operator lifts it (``libshare-control clear_quarantine``)."""


class QuotaExceeded(LibshareError):
    """A request would take a client or group past one of its limits."""


class TooManyClients(LibshareError):
    """The arbiter already serves its maximum number of clients."""


class ClientTerminated(LibshareError):
    """The operator terminated this client; every later call raises this too."""


class SessionClosed(builtins.ValueError, LibshareError):
    """This session was closed (by this process): calls on it, and waits on its tickets whose
    completion had not been read, raise this; connect again to go on."""


class InvalidSubmission(builtins.ValueError, LibshareError):
    """The arbiter rejected a descriptor or request as invalid."""


class ServerFault(LibshareError):
    """The arbiter's device faulted while this client had work on it (sticky)."""


class ProtocolError(LibshareError):
    """A peer broke the wire or shared-memory protocol."""


class RingCorrupted(ProtocolError):
    """A shared-memory ring's header or indexes failed validation."""


class RingFull(builtins.BlockingIOError, LibshareError):
    """A non-blocking push found no free slot; wait for completions and retry."""


class Timeout(builtins.TimeoutError, LibshareError):
    """A wait ran past its timeout."""


class VulkanUnavailable(LibshareError):
    """No usable Vulkan driver or device was found."""


class AlreadyServing(LibshareError):
    """Another arbiter (or control daemon) already serves this pipe directory."""


class StartFailed(LibshareError):
    """A background arbiter exited, or did not become ACTIVE, before it could serve."""


def remote_error(fields: dict) -> LibshareError:
    """The exception an arbiter's refusal ``{"error": CLASS, "message": TEXT}`` stands for."""
    cls = globals().get(str(fields.get("error")))
    if not (isinstance(cls, type) and issubclass(cls, LibshareError)):
        cls = ProtocolError
    return cls(fields.get("message", "the arbiter refused the request"))
