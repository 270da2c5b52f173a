"""The ``import`` request: a reattaching session hands a new arbiter the memfds it kept.

A descriptor a client sends is hostile. Each attack sends the arbiter something that is not
what a session keeps (another kind of file, a memfd that could shrink under the arbiter's
mapping, one that is read-only or write-sealed, one of another size, an id already given
out), beside an honest client whose results are checked; each is refused with a clear
error to that client alone, the arbiter keeps no descriptor of it, and it stays ACTIVE.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import mmap
import os
import socket
import struct

import numpy as np
import libshare
from libshare.arbiter import Arbiter
from libshare.client.buffers import Buffer
from libshare.protocol.control import ControlConnection
from libshare.ring._region import sealed_memfd

from tests.arbiter.conftest import open_fds
from tests.arbiter.test_connection_attacks import frame, reply, saxpy_checked, session_raw

PAGE = mmap.PAGESIZE


def _import(sock: socket.socket, fd: int, size: int, **fields) -> dict:
    sock.sendmsg([frame({"op": "import", "size": size, **fields})],
                  [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
    return reply(sock)


def _memfd(size: int, seals: int) -> int:
    fd = os.memfd_create("attack", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


_SHRINK_GROW_SEAL = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def _hugetlb_memfd(size: int) -> int | None:
    """A sealed MFD_HUGETLB memfd of ``size`` bytes, or None where the kernel makes none."""
    try:
        fd = os.memfd_create("attack", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING | os.MFD_HUGETLB)
    except OSError:
        return None
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SHRINK_GROW_SEAL)
    return fd


def _attacks(tmp_path):
    """(what, a descriptor the attack sends, the size it declares, the words the refusal must say)."""
    plain = tmp_path / "plain"
    plain.write_bytes(b"\0" * PAGE)
    read_only = sealed_memfd("attack", PAGE)
    yield "a regular file", os.open(plain, os.O_RDWR), PAGE, "not a sealed memfd"
    yield "a pipe", os.pipe()[0], PAGE, "not a sealed memfd"
    yield "an unsealed memfd (it could shrink)", _memfd(PAGE, 0), PAGE, "seals"
    yield "a memfd sealed but not against shrinking", _memfd(PAGE, fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL), PAGE, "seals"
    yield "a write-sealed memfd", _memfd(PAGE, _SHRINK_GROW_SEAL | fcntl.F_SEAL_WRITE), PAGE, "seals"
    yield "a memfd smaller than declared", sealed_memfd("attack", PAGE), 4 * PAGE, "holds 4096 bytes"
    huge = _hugetlb_memfd(2 << 20)
    if huge is not None:  # every check but its pages passes
        yield "a hugetlb memfd", huge, 2 << 20, "2097152-byte pages"
    yield "a memfd opened read-only", os.open(f"/proc/self/fd/{read_only}", os.O_RDONLY), PAGE, "reading and writing"
    os.close(read_only)


def test_hostile_imports_are_refused_and_leave_nothing(daemon, tmp_path):
    process, pipe_dir = daemon
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as honest:
        saxpy_checked(honest)
        attacker = session_raw(pipe_dir)
        try:
            before = open_fds(process.pid)
            for _ in range(20):  # 160 descriptors sent: none may stay
                for what, fd, size, words in _attacks(tmp_path):
                    try:
                        answer = _import(attacker, fd, size)
                    finally:
                        os.close(fd)
                    assert answer.get("error") == "InvalidSubmission" and words in answer["message"], (what, answer)
            answer = reply_to(attacker, {"op": "import", "size": PAGE})  # no descriptor at all
            assert answer.get("error") == "InvalidSubmission" and "exactly one memfd" in answer["message"], answer
            assert open_fds(process.pid) < before + 4  # (a few come and go: threads, a vetting child)
            saxpy_checked(honest)
        finally:
            attacker.close()
    with ControlConnection(pipe_dir) as connection:
        assert connection.run("get_server_status") == "ACTIVE"


def test_an_import_cannot_take_an_id_given_out_or_pass_the_memory_limit(daemon):
    process, pipe_dir = daemon
    attacker = session_raw(pipe_dir)
    try:
        fd = sealed_memfd("attack", PAGE)
        try:
            first = _import(attacker, fd, PAGE, id=5)
            assert first.get("ok") and first["buffer_id"] == 5, first
            again = _import(attacker, fd, PAGE, id=5)
            assert again.get("error") == "InvalidSubmission" and "given out already" in again["message"], again
            lower = _import(attacker, fd, PAGE, id=3)
            assert lower.get("error") == "InvalidSubmission", lower
            huge = _import(attacker, fd, 1 << 41)
            assert huge.get("error") in ("ProtocolError", "InvalidSubmission"), huge
        finally:
            os.close(fd)
    finally:
        attacker.close()
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as honest:
        saxpy_checked(honest)


def test_an_imported_memfd_is_the_same_memory(daemon):
    """What a reattaching session relies on: the device reads and writes the very pages it kept."""
    process, pipe_dir = daemon
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        program = session.load_program(libshare.shaders.path("saxpy"))
        x = session.array(1024)
        x[:] = np.arange(1024, dtype=np.float32)
        kept = session.alloc(PAGE)
        reply_fields = session._request("import", size=kept.size, fds=(kept.memfd,)).fields
        twin = Buffer(session, reply_fields["buffer_id"], kept.size, "shared")  # the same pages, a second id
        y = kept.array(1024)
        y[:] = 1.0
        session.dispatch(program, 16, [x, twin], struct.pack("If", 1024, 2.0)).wait(60)
        assert np.array_equal(y, 2.0 * np.arange(1024, dtype=np.float32) + 1.0)


def reply_to(sock: socket.socket, fields: dict) -> dict:
    sock.sendall(frame(fields))
    return reply(sock)


def _fmix32(h: int) -> int:
    """murmur3's 32-bit finaliser, as engine/objects.c applies it."""
    h ^= h >> 16
    h = h * 0x85EBCA6B & 0xFFFFFFFF
    h ^= h >> 13
    h = h * 0xC2B2AE35 & 0xFFFFFFFF
    return h ^ h >> 16


def _unfmix32(h: int) -> int:
    """The inverse of :func:`_fmix32` (each step is a bijection)."""
    h ^= h >> 16
    h = h * pow(0xC2B2AE35, -1, 1 << 32) & 0xFFFFFFFF
    h ^= h >> 13
    h ^= h >> 26
    h = h * pow(0x85EBCA6B, -1, 1 << 32) & 0xFFFFFFFF
    return h ^ h >> 16


def _crowding_ids(count: int) -> list[int]:
    """Buffer ids whose unkeyed hashes (the engine's of 2026-11-23: the finaliser of
    ``id ^ kind * 0x9e3779b9``) all end in the same 16 bits: ``count`` ids of one probe run."""
    kind = 0x9E3779B9  # LS_KIND_BUFFER (1) times the constant
    ids = (_unfmix32(high << 16 | 0x1234) ^ kind for high in range(1, 1 << 16))
    chosen = sorted(i for i in ids if 0 < i < 1 << 31)[:count]
    assert len({_fmix32(i ^ kind) & 0xFFFF for i in chosen}) == 1
    return chosen


def test_ids_a_session_picks_cannot_crowd_the_engines_table(tmp_path):
    """A reattaching session picks its ids. The engine's hash kept the low bits of id times a
    constant, so ids that are multiples of 2**16 all started probing at one slot: the n-th such
    buffer took n probes to add, and the engine walked that run for each of its lookups. Its
    next hash mixed every bit but was unkeyed, and a reviewer inverted it to pick 4,096 ids of
    one run (the engine's CPU per descriptor went from 3.7 to 28 us, for every client). The
    hash is keyed now: neither set of ids crowds it."""
    pipe_dir = tmp_path / "pipe"
    pipe_dir.mkdir(mode=0o700)
    arbiter = Arbiter()
    try:
        arbiter.serve(pipe_dir / "control")
        probes = {}
        for name, ids in (("multiples of 2**16", [k << 16 for k in range(1, 301)]), ("inverted", _crowding_ids(300))):
            attacker = session_raw(pipe_dir)
            with contextlib.closing(attacker):
                for object_id in ids:
                    fd = sealed_memfd("crowd", PAGE)
                    try:
                        answer = _import(attacker, fd, PAGE, id=object_id)
                    finally:
                        os.close(fd)
                    assert answer.get("ok"), answer
                (client,) = [c for c in arbiter.drainer.clients.values() if not c.closing]
                probes[name] = arbiter.drainer.engine.stats(client.slot).table_probes
    finally:
        arbiter.close()
    assert all(1 <= p <= 32 for p in probes.values()), f"adding one of 300 buffers took {probes} probes"
