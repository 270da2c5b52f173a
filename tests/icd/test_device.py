"""The Vulkan driver's device, queue, memory, buffers and fences under an unmodified program.

tests/icd/_memory.py (the ``vulkan`` bindings, through the real loader and ``libshare-run``, against a
real arbiter with lavapipe behind it) creates a device and its queue, writes host-visible memory
through a mapping and reads it back, binds buffers and uses fences; the session's memory limit and a
group's limit shared with a Python session refuse allocations past them with
VK_ERROR_OUT_OF_DEVICE_MEMORY; ``ps`` shows the device's session while it lives; hostile use ends in a
Vulkan error for that program only, beside an honest client whose results are checked; and every core
Vulkan 1.0 and 1.1 device-level command of the system's headers is offered by the driver.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import libshare
from libshare.icd import library_path
from tests.conftest import ROOT, stop_process
from tests.arbiter.conftest import start_client
from tests.control.conftest import control
from tests.icd.conftest import environment, libshare_run, probe

MEMORY = Path(__file__).resolve().parent / "_memory.py"


def run_memory(pipe_dir: Path, *args: str, **env: str) -> dict:
    return probe(libshare_run("--name", "memory", "--", sys.executable, str(MEMORY), *args),
                 environment(pipe_dir, **env))


def test_a_program_maps_writes_and_reads_back_memory_and_binds_buffers(daemon):
    _process, pipe_dir = daemon
    seen = run_memory(pipe_dir, "honest")
    assert seen["queue"] and seen["read_back"] and seen["bound"], seen
    assert seen["mapping"].startswith("/memfd:libshare-buffer"), seen  # the arbiter's memfd itself: zero copy
    size, alignment, types = seen["requirements"]
    assert alignment >= 16 and alignment & (alignment - 1) == 0 and size == -(-1000 // alignment) * alignment
    assert types == 0b11  # device-local and host-visible memory both hold a buffer
    assert seen["device_local_map"] == "VkErrorMemoryMapFailed"  # a device buffer has no mapping
    assert seen["fences"] == [
        "VkNotReady", "ok",  # made unsignaled, made signaled
        "ok", "VkTimeout", "ok",  # wait for the signaled one; for both (nothing will signal one); for either
        "VkNotReady", "ok",  # reset; signaled by the empty submission
    ]


def test_a_free_is_done_before_the_next_allocation_though_its_reply_is_not_waited_for(daemon):
    """Under a group limit of 8 MiB, 6 MB allocated and freed 200 times: each allocation fits only if the
    free before it was done (control.c sends frees without reading their replies); then 100 frees in a
    row, past the 64 replies the driver leaves unread, and one more allocation."""
    _process, pipe_dir = daemon
    assert control("--pipe-directory", str(pipe_dir), "set_group_mem_limit", "icd-churn", "8M").returncode == 0
    seen = run_memory(pipe_dir, "churn", str(6_000_000), LIBSHARE_GROUP="icd-churn")
    assert seen["allocations"] == {"ok": 201}, seen
    assert "refused" not in seen["stderr"] and "did not answer" not in seen["stderr"], seen["stderr"][-2000:]


def test_the_memory_limit_and_a_groups_limit_refuse_with_out_of_device_memory(daemon):
    _process, pipe_dir = daemon
    # The session's own limit (the heap): the second 6 MB allocation does not fit in 8 MiB.
    seen = run_memory(pipe_dir, "limit", str(6_000_000), LIBSHARE_DEVICE_MEM_LIMIT="8M")
    assert seen["allocations"] == ["ok", "VkErrorOutOfDeviceMemory"], seen
    # A group's limit, with a Python session of the group holding 4 MiB: the arbiter refuses the first.
    assert control("--pipe-directory", str(pipe_dir), "set_group_mem_limit", "icd-memory", "8M").returncode == 0
    session = libshare.connect(name="honest", mode="daemon", pipe_directory=pipe_dir, group="icd-memory")
    try:
        held = session.array(1 << 20, np.float32)  # 4 MiB
        held[:] = np.arange(1 << 20, dtype=np.float32)
        seen = run_memory(pipe_dir, "limit", str(6_000_000), LIBSHARE_GROUP="icd-memory")
        assert seen["allocations"] == ["VkErrorOutOfDeviceMemory"] * 2, seen
        assert np.array_equal(held, np.arange(1 << 20, dtype=np.float32))  # the honest session's memory, intact
        assert len(session.alloc(2 << 20).array((1 << 19,), np.float32)) == 1 << 19  # and what is left, usable
    finally:
        session.close()


def sessions_of(pipe_dir: Path, pid: int) -> int:
    table = control("--pipe-directory", str(pipe_dir), "ps").stdout
    return sum(1 for line in table.splitlines() if line.split()[:1] == [str(pid)])


def test_ps_shows_the_devices_session_while_the_device_lives(daemon):
    _process, pipe_dir = daemon
    with subprocess.Popen(libshare_run("--name", "held-device", "--", sys.executable, str(MEMORY), "hold"),
                          env=environment(pipe_dir), cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as program:
        try:
            assert program.stdout.readline() == "device\n"
            assert sessions_of(pipe_dir, program.pid) == 2  # the instance's and the device's
            program.stdin.write("destroy\n")
            program.stdin.flush()
            assert program.stdout.readline() == "destroyed\n"
            assert sessions_of(pipe_dir, program.pid) == 1  # the instance's alone
        finally:
            program.stdin.close()
            program.wait(60)
    assert program.returncode == 0
    assert sessions_of(pipe_dir, program.pid) == 0


def test_hostile_use_ends_in_vulkan_errors_beside_an_honest_client(daemon):
    _process, pipe_dir = daemon
    honest = start_client("mixed", pipe_dir, 5, 20)  # checks every result against numpy
    try:
        seen = run_memory(pipe_dir, "hostile")
        assert honest.communicate(timeout=300)[0].strip() == "ok"
    finally:
        stop_process(honest)
    invalid = "VkErrorUnknown"  # VK_ERROR_UNKNOWN: invalid input the driver detected
    assert {key: value for key, value in seen.items() if key != "stderr"} == {
        "map wrong memory": "VkErrorMemoryMapFailed", "bind wrong buffer": invalid, "bind to wrong memory": invalid,
        "wrong fence status": invalid, "reset wrong fence": invalid, "bound past its memory": invalid,
        "bind misaligned": invalid, "map past its memory": "VkErrorMemoryMapFailed", "memory type 7": invalid,
        "bound twice": invalid, "mapped twice": "01020304",
        "map freed memory": "VkErrorMemoryMapFailed", "bind to freed memory": invalid, "still works": True,
    }


def core_device_commands() -> list[str]:
    """Every core Vulkan 1.0 and 1.1 device-level command, read from the system's vulkan_core.h."""
    path = Path("/usr/include/vulkan/vulkan_core.h")
    if not path.exists():
        pytest.skip("no Vulkan headers (libvulkan-dev)")
    header = path.read_text()
    names = []
    for version in ("VK_VERSION_1_0", "VK_VERSION_1_1"):
        section = header[header.index(f"#define {version} 1"):]
        section = section[section.index("#ifndef VK_NO_PROTOTYPES"):]
        section = section[:section.index("#endif")]
        names += re.findall(r"VKAPI_ATTR \w+ VKAPI_CALL (vk\w+)\(\s*(?:VkDevice|VkQueue|VkCommandBuffer)\s", section)
    return names


def test_every_core_device_command_is_offered():
    """The loader's trampolines call what the driver gives them unchecked: none may be missing."""
    names = core_device_commands()
    assert len(names) > 130 and "vkCmdDispatch" in names and "vkGetDeviceQueue2" in names
    driver = ctypes.CDLL(str(library_path()))
    lookup = driver.vk_icdGetInstanceProcAddr
    lookup.restype, lookup.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
    device_lookup = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
        lookup(None, b"vkGetDeviceProcAddr"))
    assert [name for name in names if not device_lookup(None, name.encode())] == []
    assert [name for name in names if not lookup(None, name.encode())] == []
    assert device_lookup(None, b"vkCmdDrawMeshTasksEXT") is None  # an extension not offered: absent
