"""Specialization constants: frozen into the module before admission (libshare/arbiter/programs/specialize.py).

Every size a constant sets (the workgroup, a shared array, a private array) is checked on the
specialized module, beside an honest client whose results are checked; programs are shared by module
and constants; a reattach loads a program with its constants again.
"""

from __future__ import annotations

import os
import signal
import struct

import numpy as np
import pytest

import libshare
from libshare.arbiter.device import Device
from libshare.arbiter.programs import loading as _programs, specialize as _specialize
from libshare.arbiter.programs.spirv import reflect
from libshare.errors import InvalidSubmission

from tests.arbiter._specialized import compiled, expected
from tests.arbiter.conftest import wait_until
from tests.arbiter.test_programs import arbiter  # noqa: F401 - the fixture: an in-process arbiter
from tests.arbiter.test_reattach import supervised  # noqa: F401 - the fixture

_SPEC_OPS = {48, 49, 50, 51, 52}


@pytest.fixture
def kernel(tmp_path, monkeypatch) -> bytes:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return compiled()


def _run(session, program, groups: int = 3) -> np.ndarray:
    out = session.array(groups * program.local_size[0])
    session.dispatch(program, groups, [out]).wait(60)
    return out


def _opcodes(spirv: bytes) -> set[int]:
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    found, pos = set(), 5
    while pos < len(words):
        found.add(words[pos] & 0xFFFF)
        pos += words[pos] >> 16
    return found


def test_constants_set_the_workgroup_the_shared_array_and_the_values(arbiter, kernel):  # noqa: F811
    _, pipe_dir = arbiter
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        for constants in ({}, {0: 32, 1: 8, 2: 3.0}, {0: 128, 1: 100, 2: -0.5, 4: True}, {1: 5, 3: 1}):
            program = session.load_program(kernel, constants=constants)
            assert program.local_size == (constants.get(0, 64), 1, 1)
            assert program.constants == constants
            assert np.array_equal(_run(session, program), expected(3, constants)), constants


def test_programs_are_shared_by_module_and_constants(arbiter, kernel):  # noqa: F811
    served, pipe_dir = arbiter
    pipelines = served.drainer.pipelines
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as first, \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as second:
        first.load_program(kernel)
        second.load_program(kernel)
        assert len(pipelines) == 1
        narrow = first.load_program(kernel, constants={0: 32})
        assert len(pipelines) == 2, "other constants, the same pipeline"
        second.load_program(kernel, constants={0: 32})
        second.load_program(kernel, constants={0: 64, 2: 1.0})  # the defaults: the module frozen as it is
        assert len(pipelines) == 2
        assert np.array_equal(_run(first, narrow), expected(3, {0: 32}))


def test_constants_cannot_smuggle_a_size_past_admission(arbiter, kernel):  # noqa: F811
    """Each constant that would size something past a limit is refused, naming it, to that client only."""
    _, pipe_dir = arbiter
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as honest, \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as attacker:
        mine = honest.load_program(kernel, constants={1: 8})
        assert np.array_equal(_run(honest, mine), expected(3, {1: 8}))
        refusals = {
            "private variables": {3: 1 << 16},  # 256 KiB of private floats: past libshare's 64 KiB
            "workgroup size": {0: 1 << 16},
            "shared memory": {1: 1 << 20},
            "zero dimension": {0: 0},
            "constant 9 is not declared": {9: 1},
            "unsigned integer": {1: -1},
            "must be an integer": {1: 2.5},
            "is a bool": {4: 1},
            "out of its range": {2: 1e39},
        }
        for why, constants in refusals.items():
            with pytest.raises(InvalidSubmission, match=why):
                attacker.load_program(kernel, constants=constants)
        wire = ["x", [[0]], [[i, 1] for i in range(65)], [[-1, 1]], [[1 << 31, 1]], [[1, "a"]], [[1, 1], [1, 2]],
                [[1, 1 << 64]], [[1, None]], [[True, 1]]]
        for constants in wire:  # what the client library would not send
            with pytest.raises(InvalidSubmission, match="constants"):
                attacker._request("load_program", kernel, constants=constants)
        assert np.array_equal(_run(honest, mine), expected(3, {1: 8}))  # the honest client never noticed
        assert np.array_equal(_run(attacker, attacker.load_program(kernel)), expected(3, {}))


def test_the_client_checks_what_it_sends(arbiter, kernel):  # noqa: F811
    _, pipe_dir = arbiter
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        for constants in ([1, 2], {"0": 1}, {0: "64"}, {True: 1}):
            with pytest.raises(TypeError):
                session.load_program(kernel, constants=constants)
        assert session.load_program(kernel, constants={0: np.uint32(16)}).local_size == (16, 1, 1)


def test_spec_constant_expressions_are_folded_before_reflection(kernel, vulkan_device_name):
    """A shared array sized by ``(BLOCK + 1) / 2 * 2`` is not a plain constant until frozen."""
    with pytest.raises(InvalidSubmission, match="could not be folded"):
        reflect(kernel)
    frozen = _specialize.specialize(kernel)
    assert not _opcodes(frozen) & _SPEC_OPS
    assert reflect(frozen).workgroup_bytes == 16 * 4 and reflect(frozen).local_size == (64, 1, 1)
    with Device() as device:
        admitted = _programs.Interfaces().of(kernel, device, [[1, 7]])
        assert admitted.interface.workgroup_bytes == 8 * 4 and admitted.module != kernel
        assert not _opcodes(admitted.module) & _SPEC_OPS


def test_a_module_without_spec_constants_is_not_rewritten(vulkan_device_name):
    saxpy = libshare.shaders.path("saxpy").read_bytes()
    assert _specialize.specialize(saxpy) == saxpy
    with pytest.raises(InvalidSubmission, match="constant 0 is not declared by this module .*none"):
        _specialize.specialize(saxpy, [[0, 1]])
    with Device() as device:
        admitted = _programs.Interfaces().of(saxpy, device)
        assert admitted.module == saxpy and admitted.digest == admitted.key


def test_the_admission_cache_tells_constants_apart(kernel, vulkan_device_name):
    interfaces = _programs.Interfaces()
    with Device() as device:
        plain, narrow = interfaces.of(kernel, device), interfaces.of(kernel, device, [[0, 16]])
        assert plain.key != narrow.key and plain.digest != narrow.digest
        assert narrow.interface.local_size == (16, 1, 1) and plain.interface.local_size == (64, 1, 1)
        assert interfaces.of(kernel, device, [[0, 16]]) == narrow
        assert interfaces.of(kernel, device, [[0, 64]]).digest == plain.digest  # the defaults, frozen alike
        with pytest.raises(InvalidSubmission, match="workgroup"):
            interfaces.of(kernel, device, [[0, 1 << 16]])
        assert len(interfaces._known) == 4  # the refusal is remembered too


def test_local_size_id_takes_the_specialized_size(tmp_path, monkeypatch):
    """SPIR-V 1.6 sizes the workgroup with ``OpExecutionModeId LocalSizeId`` over the constants."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    module = compiled("vulkan1.3")
    assert 38 in _modes(module)  # LocalSizeId
    assert reflect(_specialize.specialize(module, [[0, 48], [1, 100]])).local_size == (48, 1, 1)
    assert reflect(_specialize.specialize(module)).local_size == (64, 1, 1)


def _modes(spirv: bytes) -> set[int]:
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    modes, pos = set(), 5
    while pos < len(words):
        if words[pos] & 0xFFFF in (16, 331):  # OpExecutionMode(Id)
            modes.add(words[pos + 2])
        pos += words[pos] >> 16
    return modes


def test_a_crashing_or_hanging_optimizer_costs_a_child(kernel, tmp_path, monkeypatch):
    tool = tmp_path / "spirv-opt"
    monkeypatch.setattr(_specialize.shutil, "which", lambda name: str(tool))
    tool.write_text("#!/bin/sh\nkill -SEGV $$\n")
    tool.chmod(0o755)
    with pytest.raises(InvalidSubmission, match="crashed"):
        _specialize.specialize(kernel, [[0, 32]])
    tool.write_text("#!/bin/sh\nexec sleep 60\n")
    monkeypatch.setattr(_specialize, "_FREEZE_TIMEOUT", 0.2)
    with pytest.raises(InvalidSubmission, match="longer than"):
        _specialize.specialize(kernel, [[0, 32]])
    tool.write_text("#!/bin/sh\necho 'error: line 1: bad module' >&2\nexit 1\n")
    with pytest.raises(InvalidSubmission, match="bad module"):
        _specialize.specialize(kernel, [[0, 32]])


def test_without_spirv_opt_the_defaults_are_set_and_expressions_refused(kernel, monkeypatch):
    monkeypatch.setattr(_specialize.shutil, "which", lambda name: None)
    module = _specialize.specialize(kernel, [[0, 32], [1, 8]])
    with pytest.raises(InvalidSubmission, match="could not be folded"):
        reflect(module)  # the shared array's length is BLOCK's expression
    words = struct.unpack(f"<{len(module) // 4}I", module)
    assert 32 in words and 8 in words


def test_a_reattach_loads_the_program_with_its_constants(supervised, kernel):  # noqa: F811 - the fixture
    with libshare.connect(mode="daemon", pipe_directory=supervised.pipe, timeout=30) as session:
        constants = {0: 32, 1: 8, 2: 3.0, 4: True}
        program = session.load_program(kernel, constants=constants)
        out = session.array(3 * 32)
        session.dispatch(program, 3, [out]).wait(60)
        assert np.array_equal(out, expected(3, constants))
        out[:] = 0
        before = supervised.arbiter()
        os.kill(before, signal.SIGKILL)
        wait_until(lambda: supervised.arbiter() not in (before, None), 60, "the standby to take over")
        session.dispatch(program, 3, [out]).wait(60)  # (a call that finds the arbiter gone reattaches)
        assert np.array_equal(out, expected(3, constants))  # the same specialization
        assert session.reattached == 1 and program.lost is None
