"""Programs shared by content: one pipeline per distinct module across clients, counted by their users."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

import libshare
from libshare.arbiter import Arbiter
from libshare.arbiter.programs import admission as _admission, loading as _programs
from libshare.arbiter.device import Device
from libshare.errors import InvalidSubmission

from tests.arbiter.conftest import wait_until


@pytest.fixture
def arbiter(tmp_path, vulkan_device_name):
    """An in-process arbiter serving on ``tmp_path``; yields (arbiter, pipe directory)."""
    tmp_path.chmod(0o700)
    served = Arbiter()
    served.serve(tmp_path / "control")
    yield served, tmp_path
    served.close()


def saxpy_once(session, program) -> bool:
    x, y = session.array(64), session.array(64)
    x[:], y[:] = 2.0, 1.0
    session.dispatch(program, 1, [x, y], struct.pack("If", 64, 3.0)).wait(10)
    return bool(np.all(y == 7.0))


def test_clients_loading_one_module_share_one_pipeline(arbiter):
    served, pipe_dir = arbiter
    pipelines = served.drainer.pipelines
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as first, \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as second:
        mine = first.load_program(libshare.shaders.path("saxpy"))
        theirs = second.load_program(libshare.shaders.path("saxpy"))
        again = second.load_program(libshare.shaders.path("saxpy"))
        assert len(pipelines) == 1
        second.load_program(libshare.shaders.path("vadd"))
        assert len(pipelines) == 2
        first.free(mine)  # the other client's loads keep the pipeline alive
        assert saxpy_once(second, theirs) and saxpy_once(second, again)
        second.free(theirs)
        assert len(pipelines) == 2 and saxpy_once(second, again)
        second.free(again)
        assert first.load_program(libshare.shaders.path("busy")) is not None
        assert len(pipelines) == 2, "saxpy's pipeline still in use after its last user"  # vadd and busy
        wait_until(lambda: pipelines.idle() == 1, 10, "saxpy's pipeline left idle, kept")
    wait_until(lambda: len(pipelines) == 0, 10, "the last pipelines to go with their clients")
    assert pipelines.idle() == 3


def test_a_pipeline_left_idle_is_loaded_again_without_a_compile_and_the_idle_are_bounded(arbiter, monkeypatch):
    """A program that makes and destroys its pipelines at every step (wgpu) compiles each module once;
    past _IDLE_PIPELINES idle ones, the oldest is destroyed and compiled again when next loaded."""
    served, pipe_dir = arbiter
    pipelines = served.drainer.pipelines
    monkeypatch.setattr(_programs, "_IDLE_PIPELINES", 2)
    compiled = []
    create = served.device.create_pipeline
    monkeypatch.setattr(served.device, "create_pipeline", lambda *args: compiled.append(args[0]) or create(*args))
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        for _ in range(3):
            program = session.load_program(libshare.shaders.path("saxpy"))
            assert saxpy_once(session, program)
            session.free(program)
        assert len(compiled) == 1
        wait_until(lambda: pipelines.idle() == 1, 10, "saxpy's pipeline left idle")
        for name in ("vadd", "busy"):  # two more left idle: saxpy's, the oldest, goes
            session.free(session.load_program(libshare.shaders.path(name)))
        wait_until(lambda: pipelines.idle() == 2 and not pipelines.has(hashlib.sha256(compiled[0]).digest()), 10,
                   "the oldest idle pipeline destroyed")
        assert saxpy_once(session, session.load_program(libshare.shaders.path("saxpy")))
        assert len(compiled) == 4  # saxpy compiled again


def test_admissions_are_remembered_by_content_and_bounded(monkeypatch, vulkan_device_name):
    monkeypatch.setattr(_programs, "_INTERFACES", 2)
    validations = []
    count = lambda spirv, env=None, flags=(): validations.append(spirv)  # noqa: E731 (the real one is tested below)
    monkeypatch.setattr(_admission, "validate", count)
    interfaces = _programs.Interfaces()
    modules = [libshare.shaders.path(name).read_bytes() for name in ("saxpy", "vadd", "sum")]
    with Device() as device:
        digest, saxpy, _, _ = interfaces.of(modules[0], device)
        assert interfaces.of(bytes(modules[0]), device)[:2] == (digest, saxpy)  # same content, another object
        assert len(validations) == 1
        assert interfaces.of(modules[1], device)[1].bindings == (0, 1, 2)
        interfaces.of(modules[2], device)
        assert len(interfaces._known) == 2 and digest not in interfaces._known
        bad = b"\x03\x02\x23\x07" + bytes(16)
        for _ in range(2):  # the refusal is remembered too
            with pytest.raises(InvalidSubmission):
                interfaces.of(bad, device)
        assert hashlib.sha256(bad).digest() in interfaces._known


def test_validator_refuses_what_reflection_passes(vulkan_device_name):
    """A module whose only fault is one the validator sees (an id used before it is defined)."""
    module = bytearray(libshare.shaders.path("saxpy").read_bytes())
    _admission.validate(bytes(module))  # the shipped module passes
    words = list(struct.unpack(f"<{len(module) // 4}I", module))
    store = next(i for i, w in enumerate(words) if w & 0xFFFF == 62)  # the first OpStore
    words[store + 1] = words[3] - 1  # store to an id nothing defines
    with pytest.raises(InvalidSubmission, match="spirv-val"):
        _admission.validate(struct.pack(f"<{len(words)}I", *words))


def test_a_device_that_cannot_zero_shared_memory_runs_no_kernel_that_declares_it(vulkan_device_name):
    """Without shaderZeroInitializeWorkgroupMemory a kernel's shared memory would start as what another
    client's kernel left there (see libshare/arbiter/programs/spirv.py): such kernels are refused, the others admitted."""
    with Device() as device:
        assert device.zero_workgroup_memory  # lavapipe and Vulkan 1.3 devices have it
        device.zero_workgroup_memory = False  # as a device without the feature reports
        with pytest.raises(InvalidSubmission, match="cannot zero it"):
            _admission.admit(libshare.shaders.path("sum").read_bytes(), device)  # shared float[64]
        assert _admission.admit(libshare.shaders.path("saxpy").read_bytes(), device).bindings == (0, 1)


RESOURCES = """#version 450
layout(local_size_x = 8) in;
layout(set = 1, binding = 3) buffer Late { float late[]; };
layout(set = 0, binding = 4) uniform U { vec4 u; };
layout(set = 0, binding = 1) buffer Many { float v[]; };
layout(set = 0, binding = 0) uniform samplerBuffer texels;
void main() {
    uint i = gl_GlobalInvocationID.x;
    late[i] = v[i] + u.x + texelFetch(texels, int(i)).x;
}
"""


def test_the_load_program_reply_names_its_resources_in_bind_order(arbiter):
    """The Vulkan driver checks a pipeline layout against ``resources`` (libshare/icd/pipeline.c)."""
    _, pipe_dir = arbiter
    spirv = libshare.compile(RESOURCES)
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        fields = session._request("load_program", spirv).fields
    # Sorted by (set, binding): each one's count (an array's length, else 1) and kind.
    assert fields["resources"] == [[0, 0, 1, "uniform_texel"], [0, 1, 1, "storage"], [0, 4, 1, "uniform"],
                                   [1, 3, 1, "storage"]]
    assert fields["bindings"] == 4 and fields["entry_point"] == "main" and fields["local_size"] == [8, 1, 1]


SCALAR = """#version 450
#extension GL_EXT_scalar_block_layout : require
layout(local_size_x = 16) in;
layout(scalar, binding = 0) buffer Points { vec3 p[]; };
layout(scalar, binding = 1) buffer Lengths { float squared[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    squared[i] = dot(p[i], p[i]);
}
"""
"""vec3 elements 12 bytes apart (std430 would put them 16 apart), as vkdispatch lays out its buffers."""


def test_a_scalar_block_layout_runs_where_the_device_was_created_with_it(arbiter):
    """spirv-val holds a module to the standard layouts unless told the device allows others
    (admission.layout_flags): a device with scalarBlockLayout admits and runs a tightly packed vec3 array."""
    _, pipe_dir = arbiter
    spirv = libshare.compile(SCALAR, target_env="vulkan1.2")
    with pytest.raises(InvalidSubmission, match="spirv-val"):
        _admission.validate(spirv, "vulkan1.2")  # the standard layouts: a vec3 array's stride is 16
    with Device() as device:
        assert "scalarBlockLayout" in device.features  # lavapipe's, and most devices' since Vulkan 1.2
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
        program = session.load_program(spirv)
        points, squared = session.array((16, 3)), session.array(16)
        points[:] = np.random.default_rng(34).standard_normal((16, 3)).astype(np.float32)
        session.dispatch(program, 1, [points, squared]).wait(60)
        assert np.allclose(squared, (points * points).sum(axis=1), rtol=1e-5)
