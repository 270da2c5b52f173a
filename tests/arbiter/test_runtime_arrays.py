"""Runtime-sized arrays of buffers (``b[]``), given their length at load (libshare/arbiter/programs/arrays.py).

Real GLSL kernels compiled here with glslangValidator: one that picks a buffer of the array per
invocation, loaded with 3 and 5 buffers and checked against numpy; one whose index runs past the
length it was given, clamped to the last buffer; one that indexes non-uniformly (``nonuniformEXT``),
admitted only where the device has the feature. Every hostile length is refused, naming it, to its
client alone, beside an honest streaming client whose results are checked; a reattach loads the program
with its lengths again; through the Vulkan driver, see tests/icd/test_commands.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import numpy as np
import pytest

import libshare
from libshare.arbiter.device import Device
from libshare.arbiter.programs import arrays as _arrays
from libshare.arbiter.programs.spirv import _instructions, _words, reflect
from libshare.errors import InvalidSubmission

from tests.arbiter.conftest import wait_until
from tests.arbiter.test_reattach import supervised  # noqa: F401 - the fixture
from tests.arbiter.test_resources import compile_glsl

N = 60  # invocations

PICK = """#version 450
#extension GL_EXT_nonuniform_qualifier : require
layout(local_size_x = 1) in;  // each invocation its own workgroup: its index is dynamically uniform
layout(set = 0, binding = 0) buffer B { uint x[]; } b[];
layout(set = 0, binding = 1) readonly buffer P { uint n; } p;
void main() {
    uint i = gl_GlobalInvocationID.x;
    b[i % p.n].x[i / p.n] = i * 3u + 1u;
}
"""

PAST = """#version 450
#extension GL_EXT_nonuniform_qualifier : require
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer B { uint x[]; } b[];
layout(set = 0, binding = 1) readonly buffer P { uint k; } p;
void main() { b[p.k].x[gl_GlobalInvocationID.x] = 7u; }
"""

NONUNIFORM = """#version 450
#extension GL_EXT_nonuniform_qualifier : require
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer B { uint x[]; } b[];
layout(set = 0, binding = 1) readonly buffer P { uint n; } p;
void main() {
    uint i = gl_GlobalInvocationID.x;
    b[nonuniformEXT(i % p.n)].x[i / p.n] = i * 3u + 1u;
}
"""

MIXED = """#version 450
#extension GL_EXT_nonuniform_qualifier : require
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer B { uint x[]; } b[];
layout(set = 1, binding = 2) uniform U { uint k; } u[];
layout(push_constant) uniform Q { uint i, j; } q;
void main() { b[q.i].x[0] = u[q.j].k; }
"""


NO_UINT = """               OpCapability Shader
               OpCapability RuntimeDescriptorArray
               OpExtension "SPV_EXT_descriptor_indexing"
               OpMemoryModel Logical GLSL450
               OpEntryPoint GLCompute %main "main"
               OpExecutionMode %main LocalSize 1 1 1
               OpDecorate %rt_float ArrayStride 4
               OpMemberDecorate %B 0 Offset 0
               OpDecorate %B Block
               OpDecorate %b DescriptorSet 0
               OpDecorate %b Binding 0
       %void = OpTypeVoid
         %fn = OpTypeFunction %void
      %float = OpTypeFloat 32
   %rt_float = OpTypeRuntimeArray %float
          %B = OpTypeStruct %rt_float
       %rt_B = OpTypeRuntimeArray %B
      %ptr_B = OpTypePointer StorageBuffer %rt_B
          %b = OpVariable %ptr_B StorageBuffer
        %int = OpTypeInt 32 1
      %int_1 = OpConstant %int 1
      %int_0 = OpConstant %int 0
    %float_2 = OpConstant %float 2
  %ptr_float = OpTypePointer StorageBuffer %float
       %main = OpFunction %void None %fn
      %entry = OpLabel
          %p = OpAccessChain %ptr_float %b %int_1 %int_0 %int_0
               OpStore %p %float_2
               OpReturn
               OpFunctionEnd
"""
"""b[] in assembly, with no 32-bit unsigned integer type: the length's type is made."""
LATE_UINT = NO_UINT.replace("%int = OpTypeInt 32 1\n",
                            "%int = OpTypeInt 32 1\n%uint = OpTypeInt 32 0\n%uint_5 = OpConstant %uint 5\n")
"""The same with the type declared after the array: it is moved before it."""


def _pick(session, program, n: int) -> list[np.ndarray]:
    outs = [session.array(N, np.uint32) for _ in range(n)]
    params = session.array(4, np.uint32)
    params[0] = n
    session.dispatch(program, N, [*outs, params]).wait(60)
    return outs


def _expected(n: int) -> list[np.ndarray]:
    outs = [np.zeros(N, np.uint32) for _ in range(n)]
    for i in range(N):
        outs[i % n][i // n] = i * 3 + 1
    return outs


def test_a_runtime_array_takes_the_length_given_at_load(tmp_path):
    spirv = compile_glsl(tmp_path, "pick", PICK)
    with libshare.connect(mode="embedded") as session:
        for n in (3, 5):
            program = session.load_program(spirv, array_lengths={(0, 0): n})
            assert program.bindings == n + 1 and program.array_lengths == {(0, 0): n}
            for got, want in zip(_pick(session, program, n), _expected(n)):
                assert np.array_equal(got, want), n


def test_an_index_past_the_length_is_clamped_to_the_last_buffer(tmp_path):
    with libshare.connect(mode="embedded") as session:
        program = session.load_program(compile_glsl(tmp_path, "past", PAST), array_lengths={(0, 0): 3})
        beside = [session.array(64, np.uint32) for _ in range(2)]  # allocated around the array's
        outs = [session.array(64, np.uint32) for _ in range(3)]
        beside.append(session.array(64, np.uint32))
        params = session.array(4, np.uint32)
        params[0] = 5  # two past the end
        session.dispatch(program, 1, [*outs, params]).wait(60)
        assert np.all(outs[2] == 7) and not outs[0].any() and not outs[1].any()
        assert not any(buffer.any() for buffer in beside) and params[0] == 5


def test_sizing_rewrites_the_type_and_drops_the_capability(tmp_path):
    spirv = compile_glsl(tmp_path, "mixed", MIXED)
    module = _arrays.sized(spirv, [[0, 0, 4], [1, 2, 2]])
    interface = reflect(module)
    assert interface.resources == ((0, 0), (1, 2)) and interface.arrays == (4, 2)
    assert interface.uniform == frozenset({4, 5})
    before, after = list(_instructions(_words(spirv))), list(_instructions(_words(module)))
    assert [opcode for opcode, _ in before].count(29) == 3  # OpTypeRuntimeArray: x[], b[], u[]
    assert [opcode for opcode, _ in after].count(29) == 1  # x[] alone: a buffer's own runtime array stays
    assert (17, (5302,)) in before and (17, (5302,)) not in after  # OpCapability RuntimeDescriptorArray
    assert module[12:16] != spirv[12:16]  # the id bound grew by the new lengths
    assert _arrays.sized(module, []) == module  # sized: nothing left to size


@pytest.mark.parametrize("source", [NO_UINT, LATE_UINT], ids=["no uint", "uint declared late"])
def test_the_length_gets_a_type_declared_before_the_array(tmp_path, source):
    if shutil.which("spirv-as") is None or shutil.which("spirv-val") is None:
        pytest.skip("spirv-as and spirv-val are not installed (apt-get install spirv-tools)")
    (tmp_path / "m.spvasm").write_text(source)
    subprocess.run(["spirv-as", "--target-env", "vulkan1.1", str(tmp_path / "m.spvasm"), "-o", str(tmp_path / "m.spv")],
                   check=True, capture_output=True)
    module = _arrays.sized((tmp_path / "m.spv").read_bytes(), [[0, 0, 3]])
    (tmp_path / "sized.spv").write_bytes(module)
    checked = subprocess.run(["spirv-val", "--target-env", "vulkan1.2", str(tmp_path / "sized.spv")],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    assert reflect(module).arrays == (3,)
    assert [ops[1:] for opcode, ops in _instructions(_words(module)) if opcode == 21].count((32, 0)) == 1


def test_nonuniform_indexing_needs_the_device_feature(tmp_path, vulkan_device_name):
    spirv = compile_glsl(tmp_path, "nonuniform", NONUNIFORM)
    features = Device(0).features
    with libshare.connect(mode="embedded") as session:
        if "shaderStorageBufferArrayNonUniformIndexing" not in features:  # lavapipe (Mesa 22): not there
            with pytest.raises(InvalidSubmission, match="StorageBufferArrayNonUniformIndexing needs the device "
                                                        "feature shaderStorageBufferArrayNonUniformIndexing"):
                session.load_program(spirv, array_lengths={(0, 0): 3})
            return
        program = session.load_program(spirv, array_lengths={(0, 0): 3})
        outs = [session.array(N, np.uint32) for _ in range(3)]
        params = session.array(4, np.uint32)
        params[0] = 3
        session.dispatch(program, 1, [*outs, params]).wait(60)
        assert all(np.array_equal(got, want) for got, want in zip(outs, _expected(3)))


def test_the_admission_cache_and_pipelines_tell_lengths_apart(tmp_path, vulkan_device_name):
    from libshare.arbiter.programs.loading import Interfaces
    spirv = compile_glsl(tmp_path, "pick", PICK)
    device = Device(0)
    try:
        interfaces = Interfaces()
        three, five = interfaces.of(spirv, device, (), [[0, 0, 3]]), interfaces.of(spirv, device, (), [[0, 0, 5]])
        assert three.digest != five.digest and three.key != five.key
        assert len(three.interface.bindings) == 4 and len(five.interface.bindings) == 6
        assert interfaces.of(spirv, device, (), [[0, 0, 3]]).digest == three.digest
    finally:
        device.close()


def test_hostile_lengths_are_refused_to_their_client_alone(tmp_path, daemon, streams):
    process, pipe = daemon
    honest = streams(pipe)
    wait_until(lambda: honest.served_by(process.pid), 120, "the honest client's first dispatch")
    spirv = compile_glsl(tmp_path, "pick", PICK)
    with libshare.connect(name="attacker", mode="daemon", pipe_directory=pipe) as attacker:
        refusals = {
            r"set 0, binding 0 are a runtime-sized array .* must give its length": None,
            r"set 0, binding 3 is not a runtime-sized array of buffers .*\(set 0, binding 0\)": {(0, 0): 3, (0, 3): 2},
            r"set 0, binding 1 is not a runtime-sized array": {(0, 0): 3, (0, 1): 1},
            r"given length 0; a length is 1\.\.32": {(0, 0): 0},
            r"given length -2; a length is 1\.\.32": {(0, 0): -2},
            r"given length 33; a length is 1\.\.32": {(0, 0): 33},
        }
        for why, lengths in refusals.items():
            with pytest.raises(InvalidSubmission, match=why):
                attacker.load_program(spirv, array_lengths=lengths)
        wire = {"set, binding and length must be integers": [[0, 0, 2.5]], "integers": [[0, 0, "3"]],
                "must be integers ": [[0, 0, True]], "triple": [[0, 0]], "list of at most 32": [[0, 0, 1]] * 33,
                "given twice": [[0, 0, 3], [0, 0, 3]], "0..4294967295": [[-1, 0, 3]], "at most": "x"}
        for why, arrays in wire.items():  # what the client library would not send
            with pytest.raises(InvalidSubmission, match=why):
                attacker._request("load_program", spirv, arrays=arrays)
        with pytest.raises(InvalidSubmission, match=r"declares 33 buffers"):  # past libshare's 32 with its other
            attacker.load_program(spirv, array_lengths={(0, 0): 32})
        with pytest.raises(TypeError):
            attacker.load_program(spirv, array_lengths={(0, 0): 2.5})
        program = attacker.load_program(spirv, array_lengths={(0, 0): 5})  # the attacker's session goes on
        assert all(np.array_equal(got, want) for got, want in zip(_pick(attacker, program, 5), _expected(5)))
    end = honest.finish()
    assert end["ok"] > 0 and end["restarted"] == 0 and not any(e["event"] == "wrong" for e in honest.events)


def test_a_reattach_loads_the_program_with_its_lengths(supervised, tmp_path):  # noqa: F811 - the fixture
    spirv = compile_glsl(tmp_path, "pick", PICK)
    with libshare.connect(mode="daemon", pipe_directory=supervised.pipe, timeout=30) as session:
        program = session.load_program(spirv, array_lengths={(0, 0): 5})
        outs = _pick(session, program, 5)
        params = session.array(4, np.uint32)
        params[0] = 5
        assert all(np.array_equal(got, want) for got, want in zip(outs, _expected(5)))
        for out in outs:
            out[:] = 0
        before = supervised.arbiter()
        os.kill(before, signal.SIGKILL)
        wait_until(lambda: supervised.arbiter() not in (before, None), 60, "the standby to take over")
        session.dispatch(program, N, [*outs, params]).wait(60)  # (a call that finds the arbiter gone reattaches)
        assert session.reattached == 1 and program.lost is None
        assert all(np.array_equal(got, want) for got, want in zip(outs, _expected(5)))  # the same five buffers
