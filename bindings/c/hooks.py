"""The control plane of libshare.so, served by the Python client inside the C process.

build.py makes this file the cffi embedding's init code: it runs once, in the
embedded interpreter, on the first control call of the process (connect or
serve), after build.py's preamble has put the building environment's
site-packages on ``sys.path``. Each ``lsx_py_*`` hook declared in hooks.h is
defined here; it returns 1, or a negative code after setting the calling
thread's message with ``lib.lsx_set_error``. The hot path (dispatch, wait)
never comes here: capi.c runs it on the ring directly, and reads the session's
completion ring itself; so the Session moves to a new arbiter (a restart under
the control daemon) only when C asks, through ``lsx_py_reattach``
(``Reattacher.reattach_external``, libshare/client/reattach.py), once it has stopped using the old ring.

Embedded default: ``libshare.connect`` in mode "auto" starts the arbiter in
this interpreter when no daemon answers, so a C program needs no daemon; its
drain runs on Python threads of the C process, which release the GIL while
they wait, and ``lsx_py_shutdown`` (registered by capi.c with ``atexit``)
closes it when the program exits.
"""

import errno
import itertools
import os
import threading
from pathlib import Path

from _libshare_capi import ffi, lib  # noqa: E402 - the module this code initialises

import libshare  # noqa: E402
from libshare.protocol import paths as _config
from libshare import errors  # noqa: E402
from libshare.client.groups import make_group  # noqa: E402

OK = 1
_handles = itertools.count(1)
_clients: dict = {}
_lock = threading.Lock()
_served = None


class _Client:
    """One C session's Python half: the Session and what it handed out to C."""

    def __init__(self, session):
        self.session = session
        self.buffers = {}
        """buffer id -> libshare.Buffer, kept so that the mapping C points into stays."""
        self.views = {}
        """view id -> libshare.TexelView (ls_texel_view)."""


def _code_of(exc: BaseException) -> int:
    """The negative code C is answered with for ``exc``: a libshare error's from the error table
    (libshare/errors.py: its class's code, or its nearest base's), -errno for an OSError, -EINVAL
    for a bad argument, and -LS_EPYTHON for anything else."""
    name = errors.code_for(exc)
    if name is not None:
        return -getattr(lib, name)
    if isinstance(exc, OSError) and exc.errno:
        return -exc.errno
    if isinstance(exc, (ValueError, TypeError, KeyError)):
        return -errno.EINVAL
    return -lib.LS_EPYTHON


def _answer(fn):
    """Run a hook body: 1 on success, else the error's code with its message set for C."""
    def hook(*args):
        try:
            fn(*args)
            return OK
        except BaseException as exc:  # nothing may escape into C
            message = f"{type(exc).__name__}: {exc}".encode(errors="replace")
            return lib.lsx_set_error(_code_of(exc), message)

    hook.__name__ = fn.__name__
    hook.__doc__ = fn.__doc__
    return ffi.def_extern(name=fn.__name__, error=-lib.LS_EPYTHON)(hook)


def _text(pointer) -> str | None:
    return ffi.string(pointer).decode() if pointer != ffi.NULL else None


def _client(handle: int) -> _Client:
    client = _clients.get(handle)
    if client is None:
        raise ValueError(f"session handle {handle} is not connected")
    return client


def _region_view(session) -> tuple[int, int, int, int]:
    """Address and size of the session's ring mapping, its doorbell fd, and a dup of its peer pidfd.

    These are the Session's private attributes: the one place that knows them.
    """
    region = session._gate.attached.region
    view = ffi.from_buffer(region._map)
    try:
        address = int(ffi.cast("uintptr_t", view))
    finally:
        ffi.release(view)
    pidfd = os.dup(region.peers._pidfd) if region.peers._pidfd >= 0 else -1
    return address, region.size, session._gate.attached.wake_fd, pidfd


@_answer
def lsx_py_connect(options, out):
    """Connect a libshare.Session and hand its ring to C."""
    kwargs = {"name": _text(options.name), "priority": _text(options.priority), "mode": _text(options.mode),
              "pipe_directory": _text(options.pipe_directory)}
    if options.timeout_ns > 0:
        kwargs["timeout"] = options.timeout_ns / 1e9
    group = _text(options.group)
    if group is not None:
        kwargs["group"] = group  # older clients raise TypeError: reported as -EINVAL
    session = libshare.connect(**kwargs)
    session._restarts.outside = True  # C reads the ring: only lsx_py_reattach may move it (C asks)
    try:
        _conn(session, out)
    except BaseException:
        session.close()
        raise
    with _lock:
        handle = next(_handles)
        _clients[handle] = _Client(session)
    out.handle = handle


def _conn(session, out) -> None:
    """Fill a struct lsx_conn (but its handle) with the session's ring view."""
    address, size, wake_fd, pidfd = _region_view(session)
    out.wake_fd, out.peer_pidfd = wake_fd, pidfd
    out.client_id, out.embedded = session.client_id, int(session.embedded)
    out.region_addr, out.region_size = address, size
    name = session.device_name.encode()[: ffi.sizeof(out.device) - 1]
    ffi.memmove(out.device, name + b"\0", len(name) + 1)


@_answer
def lsx_py_reattach(handle, flights, count, out):
    """Move a C session to the arbiter that replaced a lost one (Reattacher.reattach_external): the
    new ring's view in ``out``, and each flight's outcome."""
    client = _client(handle)
    tickets = [flights[i].ticket for i in range(count)]
    moved = [flights[i].ticket for i in range(count) if flights[i].moved]
    outcomes = client.session._restarts.reattach_external(tickets, moved)
    for i, (_, status, device_ns, error) in enumerate(outcomes):  # (in the order given)
        flight = flights[i]
        flight.done = int(status is not None or error is not None)
        flight.status = status if status is not None else _code_of(error) if error is not None else 0
        flight.device_ns = device_ns if status is not None else 0
    out.handle = handle
    _conn(client.session, out)


@_answer
def lsx_py_lost_buffers(handle, ids, capacity, count):
    """The buffers the last reattach could not hand to the new arbiter (device buffers), and their views."""
    client = _client(handle)
    lost = [object_id for object_id, item in [*client.buffers.items(), *client.views.items()] if item.lost is not None]
    for i, buffer_id in enumerate(lost[:capacity]):
        ids[i] = buffer_id
    count[0] = len(lost)


@_answer
def lsx_py_close(handle):
    """Close the session and every mapping it handed out."""
    with _lock:
        client = _clients.pop(handle, None)
    if client is None:
        return
    for buffer in client.buffers.values():
        _unmap(buffer)
    client.session.close()


def _unmap(buffer) -> None:
    if buffer.mapping is not None:
        buffer.mapping.close()


@_answer
def lsx_py_load_program(handle, code, nbytes, path, constants, count, arrays, array_count, out):
    """Load SPIR-V from memory or from a file, with ``count`` specialization constants (checked by C) and
    ``array_count`` lengths of runtime arrays of buffers (checked by the arbiter)."""
    spirv = Path(_text(path)) if path != ffi.NULL else ffi.buffer(code, nbytes)[:]
    values = {}
    for k in range(count):
        item = constants[k]
        if item.id in values:
            raise ValueError(f"ls_load_program_constants: constant id {item.id} is given twice")
        values[item.id] = (bool(item.value.u) if item.type == lib.LS_CONSTANT_BOOL else
                           item.value.i if item.type == lib.LS_CONSTANT_INT else
                           item.value.u if item.type == lib.LS_CONSTANT_UINT else item.value.f)
    lengths = {(arrays[k].set, arrays[k].binding): arrays[k].length for k in range(array_count)}
    if len(lengths) != array_count:
        raise ValueError("ls_load_program_arrays: a (set, binding) is given twice")
    program = _client(handle).session.load_program(spirv, constants=values or None, array_lengths=lengths or None)
    out.id, out.bindings, out.push_size = program.id, program.bindings, program.push_size
    out.local_size = list(program.local_size)


@_answer
def lsx_py_alloc(handle, nbytes, kind, out):
    """Allocate a buffer; a shared one stays mapped here until freed."""
    client = _client(handle)
    buffer = client.session.alloc(nbytes, "shared" if kind == lib.LS_BUFFER_SHARED else "device")
    client.buffers[buffer.id] = buffer
    out.id, out.kind, out.size = buffer.id, kind, buffer.size
    out.data = ffi.cast("void *", buffer.address) if buffer.mapping is not None else ffi.NULL


@_answer
def lsx_py_texel_view(handle, buffer_id, format, offset, nbytes, out):
    """A texel view of a buffer of the session (nbytes 0: whole texels to its end)."""
    client = _client(handle)
    buffer = client.buffers.get(buffer_id)
    if buffer is None:
        raise errors.InvalidSubmission(f"buffer {buffer_id} is not a live buffer of this session")
    view = client.session.texel_view(buffer, ffi.string(format, 64).decode(errors="replace"), offset, nbytes or None)
    client.views[view.id] = view
    out[0] = view.id


@_answer
def lsx_py_load_list(handle, commands, count, out):
    """Register ``count`` encoded commands (ls_list_dispatch, ls_list_copy) as a command list; the
    session keeps it, to hand it to a new arbiter on reattach."""
    raw = ffi.buffer(commands, count * lib.LS_DESC_SIZE)[:]
    commands_list = libshare.CommandList.from_commands(_client(handle).session, raw)
    out[0] = commands_list.id


@_answer
def lsx_py_bind_group(handle, program, bindings, count, out):
    """Bind ``count`` (buffer id, offset, range) for ``program``'s layout as a bind group; the session keeps
    it, to hand it to a new arbiter on reattach."""
    session = _client(handle).session
    loaded = session._objects.get(program)
    if not isinstance(loaded, libshare.Program):
        raise errors.InvalidSubmission(f"program {program} is not a live program of this session")
    entries = [[bindings[k].buffer, bindings[k].offset, bindings[k].range] for k in range(count)]
    out[0] = make_group(session, loaded, entries).id


@_answer
def lsx_py_free(handle, is_program, object_id):
    """Free a program, a command list (is_program LSX_FREE_LIST), a bind group (LSX_FREE_GROUP), a texel view
    (LSX_FREE_VIEW) or a buffer (and unmap it here, and forget its views)."""
    client = _client(handle)
    if is_program == lib.LSX_FREE_VIEW:
        view = client.views.pop(object_id, None)
        if view is None:
            raise errors.InvalidSubmission(f"texel view {object_id} is not a live view of this session")
        client.session.free(view)
        return
    if is_program in (lib.LSX_FREE_LIST, lib.LSX_FREE_GROUP):
        kind = libshare.CommandList if is_program == lib.LSX_FREE_LIST else libshare.BindGroup
        listed = client.session._objects.get(object_id)
        if not isinstance(listed, kind):
            raise errors.InvalidSubmission(f"{'command list' if kind is libshare.CommandList else 'bind group'} "
                                           f"{object_id} is not a live one of this session")
        client.session.free(listed)
        return
    if is_program:
        client.session.free(libshare.Program(object_id, 0, 0, (1, 1, 1)))
        return
    buffer = client.buffers.get(object_id)
    if buffer is None:
        raise errors.InvalidSubmission(f"buffer {object_id} is not a live buffer of this session")
    client.session.free(buffer)
    del client.buffers[object_id]
    for view_id in [view_id for view_id, view in client.views.items() if view.buffer is buffer]:
        del client.views[view_id]
    _unmap(buffer)


@_answer
def lsx_py_stats(handle, out):
    """Copy the arbiter's counters."""
    stats = _client(handle).session.stats()
    for field in ("submitted", "completed", "errors", "device_ns", "memory_bytes"):
        setattr(out, field, int(stats.get(field, 0)))


@_answer
def lsx_py_serve(pipe_directory):
    """Serve an arbiter in this process at a pipe directory (the daemon's layout), taking the
    directory's lock as a daemon does: an arbiter that serves it already is left alone (before,
    ls_serve renamed its own socket over a live arbiter's, which no new client could reach again)."""
    global _served
    from libshare.arbiter import Arbiter
    from libshare.daemon.directory import PidLock, remove_stale_socket
    from libshare.errors import AlreadyServing

    with _lock:
        if _served is not None:
            raise OSError(errno.EBUSY, "this process already serves an arbiter (ls_serve_stop first)")
        directory = Path(_text(pipe_directory))
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            lock = PidLock(_config.lock_path(directory), directory)
        except AlreadyServing as exc:
            raise OSError(errno.EBUSY, str(exc)) from None
        arbiter = None
        try:
            try:
                remove_stale_socket(_config.socket_path(directory), directory)
            except AlreadyServing as exc:  # a live socket without the lock: an older arbiter's, left alone
                raise OSError(errno.EBUSY, str(exc)) from None
            arbiter = Arbiter()
            arbiter.serve(_config.socket_path(directory))
        except BaseException:
            if arbiter is not None:
                arbiter.close()
            lock.release()
            raise
        _served = (arbiter, lock)


@_answer
def lsx_py_serve_stop():
    """Stop the arbiter ls_serve started."""
    global _served
    with _lock:
        served, _served = _served, None
    if served is not None:
        arbiter, lock = served
        try:
            arbiter.close()
        finally:
            lock.release()


@_answer
def lsx_py_shutdown():
    """At exit: close what is left (sessions, a served arbiter, the embedded arbiter)."""
    for handle in list(_clients):
        lsx_py_close(handle)
    lsx_py_serve_stop()
    from libshare.client import connect as _connect

    if _connect._embedded_arbiter is not None:
        _connect._embedded_arbiter.close()
