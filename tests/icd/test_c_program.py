"""libshare's Vulkan driver under an unmodified C program (tests/icd/probe.c, the loader's vulkan.h).

The program, compiled here against the loader, sees the arbiter's device through ``libshare-run``, creates
a device, writes host-visible memory through a mapping and reads it back, binds a buffer, uses a fence, and
its hostile calls (mapping twice, a wrong handle, a buffer bound past its memory, memory freed under a
buffer) are answered with errors. The driver and the program, both built with AddressSanitizer and
UndefinedBehaviorSanitizer, do the same against the real arbiter, and read a good welcome (whose arbiter
then drops the device's requests) and every broken one of tests/icd/_broken.py, without a memory error or
undefined behaviour.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from libshare.icd import _build

from tests.conftest import ROOT
from tests.icd._broken import BROKEN, GOOD, PROPERTIES_SIZE, BrokenArbiter, frame, welcome
from tests.icd.conftest import environment, libshare_run

PROBE_C = Path(__file__).resolve().parent / "probe.c"
USED = ["create_device 0", "queue 1", "allocate 0", "map 0", "map_twice 0 1", "map_again 0", "read_back 1",
        "map_wrong -5", "bind 0", "bind_past -13", "bind_wrong -13", "fence 1", "submit_empty 0", "wait 0",
        "idle 0", "binary_signal 0", "binary_wait 0", "binary_fence 0", "binary_unsignaled -13", "timeline_held 0",
        "held_status 1", "held_again -13", "held_reset -13", "timeline_timeout 2", "timeline_signal 0",
        "timeline_back -13", "timeline_wrong -13", "timeline_wait 0", "held_fence 0", "counter 0 3",
        "fence_wrong -13", "event 4", "event_set 0 3", "event_reset 0 4", "event_wrong -13", "idle_sync 0",
        "command_buffers 0", "record 0", "commands_ran 1", "cmd_event 3", "freed_pending 0", "command_pool 0", "shader_module -13", "image -8", "submit 0",
        "proc_refused -8 -8", "proc_distinct 1", "bind_freed -13", "allocator 1"]
"""What probe.c prints after its device line: a second map of mapped memory at the same address (as
lavapipe maps it, though Vulkan forbids it), VK_ERROR_MEMORY_MAP_FAILED (-5) for the maps refused,
VK_ERROR_UNKNOWN (-13) for invalid bindings, a module of one word and invalid synchronization (a wait
nothing signals, a pending fence again, a timeline going back, wrong handles), VK_NOT_READY (1) for a fence not yet
signaled, VK_TIMEOUT (2) for a wait nothing ends, VK_EVENT_SET (3) and VK_EVENT_RESET (4),
VK_ERROR_FEATURE_NOT_PRESENT (-8) for commands outside the driver's slice (those through vkGetDeviceProcAddr
too: each its own typed stub, at its own address), and the application's allocator, which the device was
made with, given back all it gave (a block freed by the wrong allocator is an invalid free under ASan)."""
VK_ERROR_INCOMPATIBLE_DRIVER = -9
VK_ERROR_INITIALIZATION_FAILED = -3
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]


def compile_probe(out: Path, *flags: str) -> Path:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    subprocess.run(["cc", "-O1", "-g", *flags, "-o", str(out), str(PROBE_C), "-lvulkan"], check=True)
    return out


def test_a_c_program_uses_a_device_its_memory_and_buffers(tmp_path, daemon, vulkan_device_name):
    _process, pipe_dir = daemon
    program = compile_probe(tmp_path / "probe")
    done = subprocess.run(libshare_run("--", str(program)), env=environment(pipe_dir, LIBSHARE_DEVICE_MEM_LIMIT="64M"),
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # one queue family, 7: graphics (in name only), compute and transfer
    assert lines[0].startswith(f"device libshare: {vulkan_device_name}|{64 << 20}|1|7|"), lines
    assert lines[1:] == USED


def sanitized_driver(tmp_path: Path) -> Path:
    """The driver built with the sanitizers, and its manifest; the manifest's path."""
    library = tmp_path / "sanitized_icd.so"
    flags = [flag for flag in _build.FLAGS if flag != "-Wl,-z,defs"]  # the sanitizers' runtime comes from the program
    subprocess.run(["cc", *flags, *SANITIZE, "-o", str(library), *map(str, _build.SOURCES), "-lcjson", "-lm"],
                   check=True)
    manifest = tmp_path / "sanitized.json"
    manifest.write_text(json.dumps({"file_format_version": "1.0.0",
                                    "ICD": {"library_path": str(library), "api_version": "1.1.0"}}))
    return manifest


def sanitized_run(program: Path, env: dict[str, str]) -> list[str]:
    done = subprocess.run([str(program)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Sanitizer" not in done.stderr and "runtime error" not in done.stderr, \
        done.stderr[-3000:]
    return done.stdout.splitlines()


def test_the_sanitized_driver_uses_a_device_against_the_real_arbiter(tmp_path, daemon, vulkan_device_name):
    _process, pipe_dir = daemon
    manifest = sanitized_driver(tmp_path)
    program = compile_probe(tmp_path / "probe", *SANITIZE)
    lines = sanitized_run(program, environment(pipe_dir, VK_DRIVER_FILES=str(manifest)))
    assert lines[0].startswith(f"device libshare: {vulkan_device_name}|") and lines[1:] == USED, lines


def test_the_driver_reads_every_welcome_without_a_memory_error(tmp_path):
    manifest = sanitized_driver(tmp_path)
    program = compile_probe(tmp_path / "probe", *SANITIZE)
    cases = {"good": (frame(welcome(), bytes(PROPERTIES_SIZE)), 2), **BROKEN}
    for i, (case, (answer, fds)) in enumerate(sorted(cases.items())):
        pipe_dir = tmp_path / f"pipe{i}"
        arbiter = BrokenArbiter(pipe_dir, answer, fds)
        try:
            done = subprocess.run([str(program)], env=environment(pipe_dir, VK_DRIVER_FILES=str(manifest),
                                                                  LIBSHARE_DEVICE_MEM_LIMIT=" Ab-c = 3M,2=1.5G"),
                                  capture_output=True, text=True, timeout=120)
        finally:
            arbiter.close()
        assert done.returncode == 0 and "Sanitizer" not in done.stderr and "runtime error" not in done.stderr, \
            (case, done.stderr[-3000:])
        if case == "good":
            heap = GOOD["physical_device"]["memory"]
            lines = done.stdout.splitlines()
            assert lines[0].startswith(f"device libshare: fake|{heap}|1|7|"), done.stdout
            # its ring is /dev/null: no region to open, so no device
            assert lines[1:] == [f"create_device {VK_ERROR_INITIALIZATION_FAILED}"], done.stdout
        else:
            assert done.stdout.splitlines() == [f"instance {VK_ERROR_INCOMPATIBLE_DRIVER}"], (case, done.stdout)
