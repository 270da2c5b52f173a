"""Shared fixtures: the Vulkan requirement switch, the device (its kind, and long dispatches sized for it),
peer processes, and the /dev/shm leak guard."""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import _busy

ROOT = Path(__file__).resolve().parent.parent


def vulkan_required() -> bool:
    """True when a missing Vulkan driver must fail the tests (CI sets LIBSHARE_REQUIRE_VULKAN=1)."""
    return os.environ.get("LIBSHARE_REQUIRE_VULKAN") == "1"


def device_selector() -> str | None:
    """The device the tests' arbiters open: LIBSHARE_DEVICE (an index or UUID), else the first."""
    return os.environ.get("LIBSHARE_DEVICE") or None


@functools.cache
def device_under_test() -> tuple[str, bool]:
    """The name of the device the tests' arbiters open (:func:`device_selector`, chosen by
    the device layer as an arbiter chooses it) and whether it is a CPU device (lavapipe) rather
    than a GPU; raises when there is none. Asked once per process: the fixtures and the busy
    scale share the answer."""
    from libshare.arbiter.device import Device

    with Device(device_selector()) as device:
        return device.name, device.cpu


def _vulkan_device() -> tuple[str, bool]:
    """device_under_test(), or a skip (a failure under LIBSHARE_REQUIRE_VULKAN=1) without one."""
    try:
        return device_under_test()
    except Exception as exc:  # noqa: BLE001 - whatever the loader or the driver raised
        message = (f"no usable Vulkan device: {exc!r} (install libvulkan1 mesa-vulkan-drivers; LIBSHARE_DEVICE, "
                   "if set, must name a device that is there)")
        if vulkan_required():
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def vulkan_device_name() -> str:
    """Name of the tested Vulkan device; skips (or fails under LIBSHARE_REQUIRE_VULKAN=1) without one."""
    return _vulkan_device()[0]


@pytest.fixture(scope="session")
def vulkan_device_is_cpu() -> bool:
    """Whether the tested Vulkan device runs on the CPU (lavapipe) rather than on a GPU."""
    return _vulkan_device()[1]


@pytest.fixture(scope="session", autouse=True)
def long_dispatches_fit_the_device() -> None:
    """Size busy.comp's long dispatches for this run's device (tests/_busy.py)."""
    try:
        _, device_is_cpu = device_under_test()
    except Exception:  # noqa: BLE001 - no device: the Vulkan tests skip or fail on their own
        return
    _busy.publish_scale(device_is_cpu, device_selector())


def spawn_peer(role: str, fd: int, *args: object) -> subprocess.Popen:
    """Start ``tests/ring/_peer.py ROLE FD ARGS`` with ``fd`` inherited."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.ring._peer", role, str(fd), *map(str, args)],
        pass_fds=(fd,),
        cwd=ROOT,
    )


def stop_process(process: subprocess.Popen, timeout: float = 20.0) -> None:
    """SIGTERM ``process`` if it still runs; SIGKILL it if it has not exited after ``timeout`` s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def killed_on_exit(process: subprocess.Popen):
    """Yield ``process``; on leaving, SIGKILL it and collect its pipes if it still runs.

    For a test that ends a child by itself (a signal, closed input) and only needs it gone if
    an assertion or a timeout got there first."""
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


@pytest.fixture(scope="session", autouse=True)
def no_shm_leftovers():
    """Fail the session if the tests leave anything new in /dev/shm."""
    before = _shm_entries()
    yield
    left = _shm_entries() - before
    assert not left, f"tests left shared-memory segments behind: {sorted(left)}"
