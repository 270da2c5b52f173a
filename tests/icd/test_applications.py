"""Real Vulkan applications through the driver: Taichi, ncnn, wgpu and vkdispatch, unmodified (issue 34).

tests/icd/_taichi_app.py (four Taichi kernels on ``ti.vulkan``), tests/icd/_ncnn_app.py (a small ncnn
network of seeded weights, on its Vulkan path and on its CPU path) and tests/icd/_wgpu_app.py (eight
WGSL kernels through wgpu-py, wgpu-native's Vulkan backend) and tests/icd/_vkdispatch_app.py (kernels,
reductions and FFTs through vkdispatch, VkFFT among them, every buffer in the scalar block layout) know
nothing of libshare. Each runs
directly on the system's Vulkan driver, and under ``libshare-run`` against a real arbiter: the results must
be identical (ncnn's Vulkan path also within float tolerance of its CPU path, and the direct run's results
as numpy computes them). Two at once, each with its own name, priority and group, show in ``ps`` by name
and priority, and ``terminate_group`` of one group takes only that group's rows away; one SIGKILLed
while it dispatches leaves the other's results and the arbiter untouched. Under a control daemon, the
arbiter SIGKILLed under one between two runs: its device moves to the new arbiter and it computes the
same again there.

The packages are the ``test`` extra's; without one, its tests skip. A run that stops under libshare-run,
an ncnn whose Vulkan device was not made ready (ncnn then falls back to its CPU path by itself), or a
Taichi or wgpu that ended on another backend than Vulkan (wgpu hides a Vulkan adapter it finds wanting
and takes OpenGL), fails
with :class:`DriverGap`: what the driver is still missing, with the application's own last words. Every
other failure is a wrong result or a harness fault. The tests are marked ``applications``
(``-m applications`` selects them). What each application asks of the driver: docs/icd.md.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests._wait import wait_until
from tests.conftest import ROOT, killed_on_exit
from tests.control.conftest import control
from tests.arbiter.test_reattach import Daemon
from tests.icd.conftest import environment, libshare_run
from tests.icd.test_reattach import kill_and_replace

pytestmark = [pytest.mark.applications, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
TAICHI = HERE / "_taichi_app.py"
NCNN = HERE / "_ncnn_app.py"
WGPU = HERE / "_wgpu_app.py"
VKDISPATCH = HERE / "_vkdispatch_app.py"
APPS = {"taichi": TAICHI, "ncnn": NCNN, "wgpu": WGPU, "vkdispatch": VKDISPATCH}
RUN_TIMEOUT = 300


class DriverGap(AssertionError):
    """An application stopped under libshare-run, or worked around the driver (ncnn's CPU fallback)."""


HINTS = {
    "bad optional access": "Taichi takes a queue family with VK_QUEUE_GRAPHICS_BIT as its graphics queue, "
                           "unconditionally (taichi/rhi/vulkan/vulkan_device_creator.cpp): the driver's family "
                           "must say graphics too",
    "Failed to allocate initial descriptor pool": "Taichi makes a descriptor pool declaring every descriptor "
                                                  "type (FREE_DESCRIPTOR_SET) as soon as its device is made, and "
                                                  "aborts when refused",
    "Adapter is not Vulkan compliant": "wgpu hides a Vulkan adapter whose conformance version is 0 "
                                       "(VkPhysicalDeviceDriverProperties)",
    "does not support scalar block layout": "vkdispatch lays out every buffer with layout(scalar) and wants "
                                            "scalarBlockLayout, which the driver reports when the arbiter's "
                                            "device has it",
    "create_dummy_buffer_image failed": "ncnn makes its device ready with command pools and buffers, a "
                                        "submission, and 1x1x1 R32_SFLOAT 3D images with their views (its dummy "
                                        "images), before it runs anything",
}
"""What an application's own words mean for the driver (docs/icd.md: "What applications ask of it")."""


def gap(what: str, stderr: str) -> DriverGap:
    hints = [hint for words, hint in HINTS.items() if words in stderr]
    return DriverGap(f"{what}{': ' + '; '.join(hints) if hints else ''}. It said: {stderr[-3000:]}")


def needs(*packages: str) -> pytest.MarkDecorator:
    """Skip unless every package is importable (looked up, not imported: Taichi starts LLVM), before any
    fixture starts an arbiter."""
    missing = [package for package in packages if importlib.util.find_spec(package) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed (the test extra has them)")


def printed(stdout: str) -> dict | None:
    """The application's JSON line (Taichi prints its banner on stdout before it), or None."""
    line = next((line for line in stdout.splitlines() if line.startswith("{")), None)
    return json.loads(line) if line else None


def direct(app: str, *args: str) -> dict:
    """``app`` run on the system's Vulkan driver, as it would run without libshare."""
    done = subprocess.run([sys.executable, str(APPS[app]), *args], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    seen = printed(done.stdout)
    assert done.returncode == 0 and seen, f"{app} failed on the system's driver: {done.stderr[-3000:]}"
    if app == "ncnn":
        assert seen["on_gpu"], f"ncnn found no Vulkan device of the system's: {done.stderr[-2000:]}"
    return seen


def under_libshare(pipe_dir: Path, app: str, *args: str, name: str | None = None) -> dict:
    """``app`` run through libshare-run against the arbiter of ``pipe_dir``; DriverGap if it stopped."""
    done = subprocess.run(libshare_run("--name", name or f"{app}-app", "--", sys.executable, str(APPS[app]), *args),
                          env=environment(pipe_dir), cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    return checked(app, printed(done.stdout), done.returncode, done.stderr)


def checked(app: str, seen: dict | None, returncode: int | None, stderr: str) -> dict:
    """``seen``, unless the application stopped or fell back to its CPU (ncnn) or another backend (Taichi):
    DriverGap."""
    if returncode not in (0, None) or seen is None:
        raise gap(f"{app} stopped under libshare-run (exit {returncode})", stderr)
    if app == "ncnn" and not seen["on_gpu"]:
        raise gap("ncnn's Vulkan device was not made ready through the driver (it fell back to its CPU path)", stderr)
    if app == "taichi" and seen["arch"] != "vulkan":
        raise gap(f"Taichi fell back to its {seen['arch']} backend: ti.init found no usable Vulkan device", stderr)
    if app == "wgpu" and seen["backend"] != "Vulkan":
        raise gap(f"wgpu took its {seen['backend']} backend: it found no Vulkan adapter it would use", stderr)
    return seen


def results(seen: dict) -> dict:
    """What an application computed (ncnn: its Vulkan path's blobs; the CPU path's are checked apart)."""
    if "gpu" in seen:
        return seen["gpu"]
    if "backend" in seen:  # wgpu
        return {key: value for key, value in seen.items() if key not in ("adapter", "backend")}
    if "hash" in seen:  # vkdispatch: each result's bytes, hashed
        return seen["hash"]
    return {key: seen[key] for key in ("saxpy", "sum", "field", "histogram")}


def taichi_expected() -> dict:
    """What _taichi_app.py's kernels compute, by numpy, from the same seeded inputs."""
    rng = np.random.default_rng(34)
    x = rng.standard_normal(4096).astype(np.float32)
    y = rng.standard_normal(4096).astype(np.float32)
    values = rng.integers(-1000, 1000, 4096).astype(np.int32)
    grid = rng.standard_normal((64, 32)).astype(np.float32)
    scale = rng.standard_normal(64).astype(np.float32)
    return {"saxpy": np.float32(2.5) * x + y, "sum": int(values.sum()),
            "field": (grid * scale[:, None] + np.arange(32, dtype=np.float32)).ravel(),
            "histogram": np.bincount((values.astype(np.int64) + 1000) * 16 // 2000, minlength=16)}


def assert_ncnn_paths_agree(seen: dict) -> None:
    for blob, values in seen["cpu"].items():
        assert np.allclose(seen["gpu"][blob], values, rtol=1e-4, atol=1e-5), blob  # float32 both ways


@needs("taichi")
def test_taichi_runs_directly_as_numpy_computes():
    seen = direct("taichi")
    expected = taichi_expected()
    assert seen["arch"] == "vulkan"  # no silent fallback to Taichi's CPU backend
    assert np.allclose(seen["saxpy"], expected["saxpy"], rtol=1e-6, atol=1e-6)
    assert seen["sum"] == expected["sum"] and seen["histogram"] == expected["histogram"].tolist()
    assert np.allclose(seen["field"], expected["field"], rtol=1e-6, atol=1e-5)


def wgpu_inputs() -> tuple[np.ndarray, np.ndarray]:
    """_wgpu_app.py's inputs."""
    sys.path.insert(0, str(HERE))
    try:
        from _wgpu_app import inputs
    finally:
        sys.path.remove(str(HERE))
    return inputs()


def wgpu_expected() -> dict:
    """What _wgpu_app.py's eight kernels compute, by numpy, from the same inputs."""
    x, words = wgpu_inputs()
    n = len(x)
    increment = np.zeros(n, np.float32)
    increment[:n // 2] = 1  # an indirect dispatch of N/128 workgroups of 64
    copies = np.zeros(n, np.float32)
    copies[n // 2:] = x[n // 2:]
    return {"affine": np.float32(2.5) * x - np.float32(1), "scaled": x * np.float32(3),
            "two_groups": x - np.float32(2) * x[::-1], "sums": x.reshape(-1, 64).sum(axis=1),
            "histogram": np.bincount(words % 16, minlength=16), "indirect": increment,
            "chain": np.full(n, 64, np.float32), "copies": copies}


def assert_wgpu_computes_as_numpy(seen: dict) -> None:
    assert seen["backend"] == "Vulkan"  # no silent fallback to its OpenGL backend
    for kernel, values in wgpu_expected().items():
        assert np.allclose(seen[kernel], values, rtol=1e-6, atol=1e-5), kernel
    x = wgpu_inputs()[0]
    if "half" in seen:  # shader-f16, where the device has it
        assert seen["half"] == (x.astype(np.float16) * np.float16(2) + np.float16(0.5)).astype(np.float32).tolist()
    assert seen.get("timed", [True, True]) == [True, True]  # timestamp-query, where the device has it


@needs("ncnn")
def test_ncnn_runs_directly_and_its_vulkan_path_agrees_with_its_cpu_path():
    seen = direct("ncnn")
    assert [len(seen["gpu"][blob]) for blob in ("conv", "pool", "fc", "prob")] == [8 * 16 * 16, 8 * 8 * 8, 10, 10]
    assert_ncnn_paths_agree(seen)
    assert abs(sum(seen["gpu"]["prob"]) - 1) < 1e-5


@pytest.mark.parametrize("app", [pytest.param(app, marks=needs(app)) for app in APPS])
def test_an_application_computes_through_libshare_what_it_computes_directly(daemon, app):
    _process, pipe_dir = daemon
    expected = direct(app)
    if app == "wgpu":  # (Taichi's and ncnn's direct runs have tests of their own)
        assert_wgpu_computes_as_numpy(expected)
    if app == "vkdispatch":
        assert expected["ok"] == {name: True for name in expected["hash"]}, expected  # as numpy computes
    seen = under_libshare(pipe_dir, app)
    assert results(seen) == results(expected)  # identical, bit for bit, on the same device
    if app == "ncnn":
        assert_ncnn_paths_agree(seen)


class Held:
    """An application held open under libshare-run (``hold``): its pid, and what it printed."""

    def __init__(self, tmp_path: Path, pipe_dir: Path, app: str, *options: str, mode: str = "hold"):
        self.app = app
        self.stderr_path = tmp_path / f"{app}-{mode}.stderr"
        with open(self.stderr_path, "w") as stderr:  # a file: a full pipe would stall it
            self.process = subprocess.Popen(
                libshare_run(*options, "--", sys.executable, str(APPS[app]), mode), env=environment(pipe_dir),
                cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            self.seen = self._first_json()
            if self.process.stdout.readline().strip() not in ("holding", "looping", "again"):
                self._stopped()
        except BaseException:  # (DriverGap included: it may still hold, waiting on its input)
            self.close()
            raise

    def _first_json(self) -> dict:
        while line := self.process.stdout.readline():
            if line.startswith("{"):
                return checked(self.app, json.loads(line), None, self.stderr_path.read_text())
        return self._stopped()

    def _stopped(self):
        self.process.wait(RUN_TIMEOUT)
        return checked(self.app, None, self.process.returncode, self.stderr_path.read_text())

    def again(self) -> dict:
        """In the ``again`` mode: what it computes when told to run once more (DriverGap if it stopped)."""
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        return checked(self.app, json.loads(line), None, "") if line else self._stopped()

    def release(self) -> int:
        """Close its input (it then exits); its exit status."""
        self.process.stdin.close()
        return self.process.wait(RUN_TIMEOUT)

    def close(self) -> None:
        """SIGKILL it if it still runs; close its pipes."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(RUN_TIMEOUT)
        self.process.stdin.close()
        self.process.stdout.close()


def rows(pipe_dir: Path, pid: int) -> list[list[str]]:
    """``ps``'s rows of process ``pid`` (its instance's session and its device's)."""
    table = control("--pipe-directory", str(pipe_dir), "ps").stdout
    return [line.split() for line in table.splitlines() if line.split()[:1] == [str(pid)]]


def priorities(pipe_dir: Path, pid: int) -> set[str]:
    return {row[5] for row in rows(pipe_dir, pid)}  # PID ID NAME DEVICE STATE PRIORITY ...


@needs("taichi", "ncnn")
def test_two_applications_at_once_show_in_ps_by_name_priority_and_group(daemon, tmp_path):
    _process, pipe_dir = daemon
    expected = {app: results(direct(app)) for app in APPS}
    taichi = ncnn = None
    try:
        taichi = Held(tmp_path, pipe_dir, "taichi", "--name", "taichi-app", "--group", "apps-taichi",
                      "--priority", "high")
        ncnn = Held(tmp_path, pipe_dir, "ncnn", "--name", "ncnn-app", "--group", "apps-ncnn", "--priority", "low")
        for held, name, priority in ((taichi, "taichi-app", "high"), (ncnn, "ncnn-app", "low")):
            seen = rows(pipe_dir, held.process.pid)
            assert len(seen) == 2 and {row[2] for row in seen} == {name}, seen  # its instance's and its device's
            assert priorities(pipe_dir, held.process.pid) == {priority}
        assert results(taichi.seen) == expected["taichi"] and results(ncnn.seen) == expected["ncnn"]
        assert max(int(row[6]) for row in rows(pipe_dir, taichi.process.pid)) > 0  # DISPATCHES: ran at the arbiter
        # The group, which ps has no column for: the operator ends one group, and only its rows go.
        assert control("--pipe-directory", str(pipe_dir), "terminate_group", "apps-ncnn").returncode == 0
        wait_until(lambda: not rows(pipe_dir, ncnn.process.pid), 30, "the ended group's sessions gone from ps")
        assert len(rows(pipe_dir, taichi.process.pid)) == 2  # its instance's and its device's, still there
        assert taichi.release() == 0
        wait_until(lambda: not rows(pipe_dir, taichi.process.pid), 30, "its sessions gone from ps")
    finally:
        for held in (taichi, ncnn):
            if held is not None:
                held.close()


@needs("taichi", "ncnn")
def test_a_killed_application_leaves_the_other_and_the_arbiter_undisturbed(daemon, tmp_path):
    process, pipe_dir = daemon
    expected = results(direct("taichi"))
    victim = Held(tmp_path, pipe_dir, "ncnn", "--name", "victim", mode="loop")  # dispatching until killed
    try:
        with open(tmp_path / "survivor.stderr", "w") as stderr:
            survivor = subprocess.Popen(
                libshare_run("--name", "survivor", "--", sys.executable, str(TAICHI)), env=environment(pipe_dir),
                cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)
        with killed_on_exit(survivor):
            victim.process.send_signal(signal.SIGKILL)  # while the survivor starts and dispatches
            assert victim.process.wait(RUN_TIMEOUT) == -signal.SIGKILL
            out, _ = survivor.communicate(timeout=RUN_TIMEOUT)
    finally:
        victim.close()
    seen = checked("taichi", printed(out), survivor.returncode, (tmp_path / "survivor.stderr").read_text())
    assert results(seen) == expected
    wait_until(lambda: not rows(pipe_dir, victim.process.pid), 30, "the killed application's sessions gone from ps")
    assert process.poll() is None  # the arbiter lives, and serves the next one as before
    assert results(under_libshare(pipe_dir, "taichi", name="after")) == expected


@pytest.mark.parametrize("app", [pytest.param(app, marks=needs(app)) for app in APPS])
def test_an_application_computes_again_after_its_arbiter_is_killed_under_it(tmp_path, app):
    """Under a control daemon. On lavapipe all of a device's memory is shared memory (memory.c), so
    with nothing in flight at the kill the device moves to the arbiter the daemon starts (docs/icd.md,
    "Surviving a restart"): programs, lists and groups made again there under their ids, the same
    pages, and lists or groups that name memory the application freed since left out."""
    expected = results(direct(app))
    daemon = Daemon(tmp_path / "pipe")
    try:
        held = Held(tmp_path, daemon.pipe, app, "--name", "through-a-restart", mode="again")
        try:
            assert results(held.seen) == expected
            new = kill_and_replace(daemon)
            assert results(held.again()) == expected  # on the new arbiter
            assert results(held.again()) == expected
            assert held.release() == 0
        finally:
            held.close()
        assert f"the device moved to pid {new}" in held.stderr_path.read_text()
    finally:
        daemon.stop()
