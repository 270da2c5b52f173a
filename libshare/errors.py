"""The libshare exception family.

Every error libshare raises derives from :class:`LibshareError`. Where a builtin
exception means the same thing, the libshare class also derives from it (the
pynacl pattern), so ``except TimeoutError`` and ``except libshare.Timeout`` both
work. Each message says what went wrong and what to do about it.

The error table (:data:`TABLE`) is the one place where a C code meets its exception and its
message: each row names a code (``LS_E*`` from libshare/ring/ring.h or bindings/c/api.h, or
an errno name), the exception Python raises for it, and the message both languages give.
Python maps a code to its exception with :func:`error_for` (the ring's binding turns a C
return code or a ticket's status into its name, ``libshare.ring._binding.code_error``), and
an exception back to the code the C API returns with :func:`code_for`;
bindings/c/generate.py writes the C messages (``ls_strerror``) from the same rows into
bindings/c/errors_table.h, and a test fails when that file is stale.
"""

from __future__ import annotations

import builtins
from typing import NamedTuple

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
    "AlreadyServing",
    "StartFailed",
    "ConfigError",
    "CompileError",
]


class LibshareError(Exception):
    """Root of every error libshare raises."""


class ArbiterUnavailable(builtins.ConnectionError, LibshareError):
    """No arbiter answers at the pipe directory (and the mode forbids embedding)."""


class ArbiterLost(builtins.ConnectionError, LibshareError):
    """The arbiter this session was attached to died or closed the connection."""


class ArbiterRestarted(ArbiterLost):
    """The arbiter went away while this ticket's work was in flight, and a control daemon starts
    (or has started) a new one: the work may not have run, or may have partly run (some of its
    workgroups or dispatches, part of its output written). Submit it again; the session
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


class ConfigError(InvalidSubmission):
    """The operator's configuration file (``--config``) cannot be used: its line (where known) and
    the reason. Nothing of it was applied."""


class CompileError(InvalidSubmission):
    """``libshare.compile`` could not turn the source into SPIR-V: the message carries the compiler's
    own (its file, line and reason); fix the source, or the defines."""


class Code(NamedTuple):
    """One row of the error table."""

    name: str
    """The code's C name: ``LS_E*`` (ring.h or api.h), or an errno name (``ETIMEDOUT``)."""
    error: type[BaseException] | None
    """The exception Python raises for the code (None: a code of the C API alone)."""
    message: str
    """What the code means and what to do: ``ls_strerror``'s text, and the Python message's."""
    answers: bool = False
    """The C API answers an ``error`` exception with this code (one row per class at most; a
    class without one takes its nearest base's)."""


TABLE: tuple[Code, ...] = (
    # ring.h: what the ring's C core returns, and the statuses an arbiter answers a ticket with
    Code("LS_ECORRUPT", RingCorrupted, "the shared-memory ring failed validation (an index in it was "
         "overwritten), so it must be dropped: connect again", answers=True),
    Code("LS_EPEERDEAD", ArbiterLost, "the process on the other side of the ring exited or closed it"),
    Code("LS_EBADSLOT", InvalidSubmission, "descriptor fields out of range"),
    Code("LS_ENOPROGRAM", InvalidSubmission, "unknown program id (never loaded, or freed)"),
    Code("LS_ENOBUFFER", InvalidSubmission, "unknown or freed buffer id (or bind group id, or texel view id: a texel "
         "binding takes a view, a buffer binding a buffer)"),
    Code("LS_EBINDINGS", InvalidSubmission, "number of buffers differs from the program's bindings (or a bind "
         "group of another layout, or a texel view's format or kind is not its binding's)"),
    Code("LS_ERANGE", InvalidSubmission, "offset or size outside the buffer, or misaligned"),
    Code("LS_EGROUPS", InvalidSubmission, "group count is 0 or beyond the device limit, or the three multiply "
         "past 2^32 - 1"),
    Code("LS_EPUSH", InvalidSubmission, "more push-constant bytes than the program declares (or not a "
         "multiple of 4)"),
    Code("LS_EFAULT", ServerFault, "the device faulted while running it"),
    Code("LS_ECANCELED", ArbiterLost, "cancelled: the arbiter shut down or ended this session"),
    Code("LS_EMOVED", ArbiterRestarted, "not run: the arbiter handed over to a new one (restart), which "
         "takes this work"),
    Code("LS_EUNSUPPORTED", InvalidSubmission, "the arbiter's device cannot run this operation (a timestamp: "
         "its queue has no timestamps, timestampValidBits 0)"),
    # api.h: what the C API returns for each exception
    Code("LS_EUNAVAILABLE", ArbiterUnavailable, "no arbiter answers and the mode forbids embedding one",
         answers=True),
    Code("LS_ELOST", ArbiterLost, "the arbiter died or closed this session and none took over: connect again",
         answers=True),
    Code("LS_EQUOTA", QuotaExceeded, "a memory or compute limit would be exceeded", answers=True),
    Code("LS_ETOOMANY", TooManyClients, "the arbiter already serves its maximum number of clients", answers=True),
    Code("LS_ETERMINATED", ClientTerminated, "the operator terminated this client (terminate_client) and "
         "cancelled its queued work: connect again to go on", answers=True),
    Code("LS_EINVALID", InvalidSubmission, "the arbiter refused the request as invalid", answers=True),
    Code("LS_ESERVER", ServerFault, "the arbiter's device faulted while this session was connected: connect "
         "again once the arbiter is ACTIVE again", answers=True),
    Code("LS_EPROTOCOL", ProtocolError, "the arbiter broke the protocol", answers=True),
    Code("LS_ETIMEOUT", Timeout, "timed out", answers=True),
    Code("LS_EVULKAN", VulkanUnavailable, "no usable Vulkan driver or device", answers=True),
    Code("LS_EPYTHON", None, "the embedded Python failed (its traceback is on stderr)"),
    Code("LS_EDENIED", AccessDenied, "the arbiter refused this user (another uid) or this command",
         answers=True),
    Code("LS_ENOTREADY", ServerNotReady, "the arbiter is not ready (FAULT, INITIALIZING or shutting down): "
         "retry once it is ACTIVE", answers=True),
    Code("LS_EFULL", RingFull, "every submission lane is taken, or a lane stayed full", answers=True),
    Code("LS_ECLOSED", SessionClosed, "the session was closed: connect again", answers=True),
    Code("LS_EREFUSED", LibshareError, "the arbiter refused the request", answers=True),
    Code("LS_ERESTARTED", ArbiterRestarted, "the arbiter went away while this work was in flight: it may not "
         "have run, or may have partly run (part of its output written); submit it again (the session "
         "reattaches by itself)", answers=True),
    Code("LS_EBUFFERLOST", BufferLost, "the device buffer died with the arbiter that held it (a restart keeps "
         "shared buffers only): allocate it again", answers=True),
    Code("LS_EQUARANTINED", Quarantined, "quarantined: this process, its tenant or this module brought "
         "arbiters down too often (libshare-control clear_quarantine lifts it)", answers=True),
    # errno values the ring's C core returns
    Code("ETIMEDOUT", Timeout, "timed out"),
    Code("EBUSY", RingFull, "every submission lane is owned by a live thread: create the region with more lanes"),
)
"""The error table: every code, its exception and its message (see the module's docstring)."""

_ROWS = {row.name: row for row in TABLE}
_ANSWERS = {row.error: row.name for row in TABLE if row.answers}


def error_for(name: str, context: str = "", detail: str = "") -> BaseException:
    """The exception the code called ``name`` stands for: its message the table's, after ``context``
    (what was being done) and before ``detail`` (in parentheses)."""
    row = _ROWS[name]
    message = row.message
    if context:
        message = f"{context}: {message}"
    if detail:
        message = f"{message} ({detail})"
    return (row.error or LibshareError)(message)


def code_for(error: BaseException) -> str | None:
    """The name of the code the C API answers ``error`` with: its class's row, or its nearest base's;
    None when none has one (an exception from outside libshare)."""
    for cls in type(error).__mro__:
        name = _ANSWERS.get(cls)
        if name is not None:
            return name
    return None


def remote_error(fields: dict) -> LibshareError:
    """The exception an arbiter's refusal ``{"error": CLASS, "message": TEXT}`` stands for."""
    cls = globals().get(str(fields.get("error")))
    if not (isinstance(cls, type) and issubclass(cls, LibshareError)):
        cls = ProtocolError
    return cls(fields.get("message", "the arbiter refused the request"))
