"""libshare's Vulkan driver under an unmodified C program (tests/icd/probe.c, the loader's vulkan.h).

The program, compiled here against the loader, sees the arbiter's device through ``libshare-run``, and
``vkCreateDevice`` is answered with an error (devices are not built yet), not a crash. Then the driver
and the program, both built with AddressSanitizer and UndefinedBehaviorSanitizer, read a good welcome and
every broken one of tests/icd/_broken.py without a memory error or undefined behaviour.
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
VK_ERROR_INITIALIZATION_FAILED = -3
VK_ERROR_INCOMPATIBLE_DRIVER = -9
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]


def compile_probe(out: Path, *flags: str) -> Path:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    subprocess.run(["cc", "-O1", "-g", *flags, "-o", str(out), str(PROBE_C), "-lvulkan"], check=True)
    return out


def test_a_c_program_sees_the_arbiters_device_and_no_device_yet(tmp_path, daemon, vulkan_device_name):
    _process, pipe_dir = daemon
    program = compile_probe(tmp_path / "probe")
    done = subprocess.run(libshare_run("--", str(program)), env=environment(pipe_dir, LIBSHARE_DEVICE_MEM_LIMIT="64M"),
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"device libshare: {vulkan_device_name}|{64 << 20}|1|6|"), lines
    assert lines[1:] == [f"create_device {VK_ERROR_INITIALIZATION_FAILED}"]


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
            assert done.stdout.splitlines()[0].startswith(f"device libshare: fake|{heap}|1|6|"), done.stdout
        else:
            assert done.stdout.splitlines() == [f"instance {VK_ERROR_INCOMPATIBLE_DRIVER}"], (case, done.stdout)
