"""The long dispatches that tests size with tests/_busy.py are long on this run's device."""

from __future__ import annotations

from libshare.arbiter.device import Device

from tests import _busy
from tests.conftest import device_selector


def test_the_scale_is_one_on_a_cpu_device_and_measured_on_a_gpu(vulkan_device_is_cpu):
    assert (_busy.scale() == 1) if vulkan_device_is_cpu else (_busy.scale() > 1)
    assert _busy.busy_iterations(1000) == 1000 * _busy.scale()
    assert _busy.busy_iterations(0xFFFFFFFF) == 0xFFFFFFFF  # a uint push constant: never past it


def test_the_reference_dispatch_sized_for_the_device_is_long(vulkan_device_is_cpu):
    """Unscaled, it took under 10 ms on an H100 (a 10 ms wait on it did not time out there) against
    about 0.5 s on this VM's lavapipe; sized, it must take a tenth of lavapipe's at least (a CPU
    faster than this VM's would shorten it, load only lengthens it)."""
    with Device(device_selector()) as device:
        seconds = _busy.reference_seconds(device, _busy.busy_iterations(_busy.REFERENCE_ITERATIONS), runs=1)
    assert seconds > _busy.REFERENCE_LAVAPIPE_S / 10
