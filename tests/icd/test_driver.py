"""libshare's Vulkan driver under an unmodified program (tests/icd/_probe.py), through the real loader.

The program runs under ``libshare-run`` against a real arbiter (lavapipe behind it) and must see one
physical device named after the arbiter's, with the real device's limits, a heap the size of its
session's memory limit and one queue family (compute and transfer, graphics in name only); with no
arbiter it sees no driver and does not crash; ``libshare-run --manifest`` names a manifest the loader takes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from libshare._proc import parent_of, running
from libshare.icd import API_VERSION, LIBRARY, library_path, manifest_path

from tests.conftest import ROOT
from tests.arbiter.conftest import run_daemon
from tests.control.conftest import control
from tests.icd.conftest import PROBE, environment, libshare_run, probe

QUEUE_GRAPHICS, QUEUE_COMPUTE, QUEUE_TRANSFER = 0x1, 0x2, 0x4
HEAP_DEVICE_LOCAL = 0x1
HOST_VISIBLE, HOST_COHERENT = 0x2, 0x4
SHADER_STAGE_COMPUTE = 0x20
KNOWN_SUBGROUP_OPERATIONS = 0xFF  # VK_SUBGROUP_FEATURE_BASIC_BIT to QUAD_BIT


def real_device(name: str) -> dict:
    """What the probe sees of device ``name`` on the real driver, without libshare."""
    seen = probe([sys.executable, str(PROBE)], environment(Path("/nonexistent")))
    return next(d for d in seen["devices"] if d["name"] == name)


def test_a_program_sees_one_device_named_after_the_arbiters(daemon, vulkan_device_name):
    _process, pipe_dir = daemon
    seen = probe(libshare_run("--name", "probe", "--", sys.executable, str(PROBE)),
                 environment(pipe_dir, LIBSHARE_DEVICE_MEM_LIMIT="96M"))
    assert len(seen["devices"]) == 1, seen
    device = seen["devices"][0]
    real = real_device(vulkan_device_name)
    assert device["name"] == f"libshare: {vulkan_device_name}"
    assert device["limits"] == real["limits"]
    assert (device["vendor_id"], device["device_id"], device["device_type"]) == \
        (real["vendor_id"], real["device_id"], real["device_type"])
    assert device["heaps"] == [[96 << 20, HEAP_DEVICE_LOCAL]]  # the session's memory limit
    assert any(flags & HOST_VISIBLE and flags & HOST_COHERENT for flags, _heap in device["types"])
    assert len(device["families"]) == 1
    flags, count, _bits = device["families"][0]
    # Graphics too, though nothing of graphics is made: applications (Taichi) pick a graphics family for compute
    assert flags == QUEUE_GRAPHICS | QUEUE_COMPUTE | QUEUE_TRANSFER and count == 1
    assert device["features"]["robustBufferAccess"] == 1
    assert {"VK_KHR_synchronization2", "VK_KHR_timeline_semaphore", "VK_KHR_driver_properties",
            "VK_EXT_host_query_reset"} <= set(device["device_extensions"])  # (features.c: the rest as the arbiter's)
    assert not {"VK_KHR_buffer_device_address", "VK_EXT_descriptor_indexing"} & set(device["device_extensions"])
    assert device["api_version"] >> 12 == (1 << 10 | 2)  # Vulkan 1.2: what the driver implements
    size, operations, stages = device["subgroup"]
    assert size == real["subgroup"][0] and operations == real["subgroup"][1] & KNOWN_SUBGROUP_OPERATIONS
    assert stages == SHADER_STAGE_COMPUTE
    assert device["max_per_set_descriptors"] == real["max_per_set_descriptors"]
    assert device["max_allocation"] == min(real["max_allocation"], 96 << 20)  # at most the heap
    assert device["storage16"][:3] == real["storage16"][:3] and device["storage16"][3] == 0  # no graphics
    assert device["variable_pointers"] == 0  # the arbiter does not enable them
    assert device["buffer_device_address"] == 0  # a raw address would escape the arbiter's bounds


def test_the_heap_is_the_groups_limit_and_ps_shows_the_program(daemon):
    """The group is seen through its limit (ps has no group column), the name and priority in ps."""
    _process, pipe_dir = daemon
    assert control("--pipe-directory", str(pipe_dir), "set_group_mem_limit", "icd-tests", "40M").returncode == 0
    with subprocess.Popen(
            libshare_run("--name", "held-probe", "--group", "icd-tests", "--priority", "low", "--", sys.executable,
                         str(PROBE), "hold"),
            env=environment(pipe_dir), cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as program:
        try:
            seen = json.loads(program.stdout.readline())
            assert program.stdout.readline() == "holding\n"
            assert seen["devices"][0]["heaps"] == [[40 << 20, HEAP_DEVICE_LOCAL]]  # its group's limit binds it
            table = control("--pipe-directory", str(pipe_dir), "ps").stdout
            row = next((line.split() for line in table.splitlines() if line.split()[:1] == [str(program.pid)]), [])
            assert row[2] == "held-probe" and row[5] == "low", table  # NAME and PRIORITY
        finally:
            program.stdin.close()
            program.wait(60)
    assert program.returncode == 0
    table = control("--pipe-directory", str(pipe_dir), "ps").stdout
    assert "held-probe" not in table  # the session ended with the instance


def test_with_no_arbiter_the_program_sees_no_driver_and_does_not_crash(tmp_path):
    seen = probe(libshare_run("--mode", "daemon", "--", sys.executable, str(PROBE)), environment(tmp_path / "none"))
    assert seen["error"] == "VkErrorIncompatibleDriver"  # the loader's answer when its only driver failed
    assert "no arbiter answers" in seen["stderr"]


def test_the_manifest_names_the_driver_and_the_loader_takes_it(daemon, vulkan_device_name):
    _process, pipe_dir = daemon
    printed = subprocess.run(libshare_run("--manifest"), env=environment(pipe_dir), cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    manifest = Path(printed.stdout.strip())
    driver = json.loads(manifest.read_text())
    assert driver["file_format_version"] == "1.0.0"
    assert driver["ICD"]["api_version"] == API_VERSION
    library = Path(driver["ICD"]["library_path"])
    assert library.is_absolute() and library.name == LIBRARY and library.is_file()
    seen = probe([sys.executable, str(PROBE)], environment(pipe_dir, VK_DRIVER_FILES=str(manifest)))
    assert [d["name"] for d in seen["devices"]] == [f"libshare: {vulkan_device_name}"]


def test_embedded_mode_starts_a_helper_arbiter_for_the_programs_lifetime(tmp_path, vulkan_device_name):
    seen = probe(libshare_run("--mode", "embedded", "--", sys.executable, str(PROBE)), environment(tmp_path / "none"))
    assert [d["name"] for d in seen["devices"]] == [f"libshare: {vulkan_device_name}"]  # (the helper's end: below)


def test_an_instance_extension_not_offered_is_refused(daemon):
    _process, pipe_dir = daemon
    code = ("import vulkan as vk\n"
            "try:\n"
            "    vk.vkCreateInstance(vk.VkInstanceCreateInfo(ppEnabledExtensionNames=['VK_KHR_surface']), None)\n"
            "except vk.VkError as exc:\n"
            "    print(type(exc).__name__)\n")
    done = subprocess.run(libshare_run("--", sys.executable, "-c", code), env=environment(pipe_dir), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "VkErrorExtensionNotPresent"), done.stderr


def test_a_manifest_that_names_another_library_is_written_again():
    path = manifest_path()
    path.write_text(path.read_text().replace(str(library_path()), "/elsewhere/libshare_icd.so"))
    assert json.loads(manifest_path().read_text())["ICD"]["library_path"] == str(library_path())


def test_libshare_run_refuses_a_bad_option_before_running_anything(tmp_path):
    marker = tmp_path / "ran"
    done = subprocess.run(libshare_run("--priority", "urgent", "--", "touch", str(marker)),
                          env=environment(tmp_path / "none"), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--priority" in done.stderr and not marker.exists()


def test_the_properties2_extension_may_be_enabled_and_answers(daemon, vulkan_device_name):
    _process, pipe_dir = daemon
    code = ("import vulkan as vk\n"
            "name = 'VK_KHR_get_physical_device_properties2'\n"
            "assert name in [e.extensionName for e in vk.vkEnumerateInstanceExtensionProperties(None)]\n"
            "instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(ppEnabledExtensionNames=[name]), None)\n"
            "get = vk.vkGetInstanceProcAddr(instance, 'vkGetPhysicalDeviceProperties2KHR')\n"
            "props = vk.VkPhysicalDeviceProperties2()\n"
            "get(vk.vkEnumeratePhysicalDevices(instance)[0], props)\n"
            "print(vk.ffi.string(props.properties.deviceName).decode())\n"
            "vk.vkDestroyInstance(instance, None)\n")
    done = subprocess.run(libshare_run("--", sys.executable, "-c", code), env=environment(pipe_dir), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, f"libshare: {vulkan_device_name}"), done.stderr


def test_embedded_mode_passes_sigterm_on_and_stops_its_helper(tmp_path, vulkan_device_name):
    with subprocess.Popen(libshare_run("--mode", "embedded", "--", sys.executable, str(PROBE), "hold"),
                          env=environment(tmp_path / "none"), cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as runner:
        try:
            assert json.loads(runner.stdout.readline())["devices"][0]["name"] == f"libshare: {vulkan_device_name}"
            assert runner.stdout.readline() == "holding\n"
            program = next(int(pid) for pid in os.listdir("/proc") if pid.isdigit() and parent_of(int(pid)) == runner.pid
                           and "_probe.py" in Path(f"/proc/{pid}/cmdline").read_text())
            directory = Path(dict(line.split("=", 1) for line in Path(f"/proc/{program}/environ").read_text()
                                  .split("\0") if "=" in line)["LIBSHARE_PIPE_DIRECTORY"])
            helper = int((directory / "arbiter.pid").read_text())
            runner.send_signal(signal.SIGTERM)
            assert runner.wait(120) == 128 + signal.SIGTERM  # the program's end, passed on
        finally:
            runner.stdin.close()
            if runner.poll() is None:
                runner.kill()
    assert not running(helper) and not directory.exists()  # stopped, and its directory gone


def test_under_a_control_daemon_the_driver_waits_for_the_arbiter_on_its_way(tmp_path, vulkan_device_name):
    pipe_dir = tmp_path / "pipe"
    pipe_dir.mkdir(mode=0o700)
    with open(pipe_dir / "control-daemon.pid", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as a control daemon holds it: an arbiter is on its way
        with subprocess.Popen(libshare_run("--mode", "daemon", "--", sys.executable, str(PROBE)),
                              env=environment(pipe_dir), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) as program:
            assert program.stderr.readline() == "creating an instance\n"  # dialing now, with no arbiter there
            with contextlib.contextmanager(run_daemon)(pipe_dir):
                out, err = program.communicate(timeout=120)
    assert [d["name"] for d in json.loads(out)["devices"]] == [f"libshare: {vulkan_device_name}"], err


CREATE_DEVICE = """
import sys
import vulkan as vk
instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(
    pApplicationInfo=vk.VkApplicationInfo(apiVersion=vk.VK_MAKE_VERSION(1, 1, 0))), None)
device = vk.vkEnumeratePhysicalDevices(instance)[0]
queue = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=0, queueCount=1, pQueuePriorities=[1.0])
asks = {
    "honest": {},
    "geometry shader": {"pEnabledFeatures": vk.VkPhysicalDeviceFeatures(geometryShader=1)},
    "geometry shader, features2": {"pNext": vk.VkPhysicalDeviceFeatures2(
        features=vk.VkPhysicalDeviceFeatures(geometryShader=1))},
    "buffer device address": {"pNext": vk.VkPhysicalDeviceBufferDeviceAddressFeatures(bufferDeviceAddress=1)},
    "16-bit input/output": {"pNext": vk.VkPhysicalDevice16BitStorageFeatures(storageInputOutput16=1)},
    "a second queue family": {"queue": vk.VkDeviceQueueCreateInfo(queueFamilyIndex=1, queueCount=1,
                                                                   pQueuePriorities=[1.0])},
    "two queues": {"queue": vk.VkDeviceQueueCreateInfo(queueFamilyIndex=0, queueCount=2,
                                                       pQueuePriorities=[1.0, 1.0])},
}
for name, ask in asks.items():
    info = vk.VkDeviceCreateInfo(queueCreateInfoCount=1, pQueueCreateInfos=[ask.pop("queue", queue)], **ask)
    try:
        vk.vkDestroyDevice(vk.vkCreateDevice(device, info, None), None)
        print(name, "created", sep=": ")
    except vk.VkError as exc:
        print(name, type(exc).__name__, sep=": ")
vk.vkDestroyInstance(instance, None)
"""


def test_create_device_answers_the_specifications_errors_and_makes_an_honest_device(daemon):
    _process, pipe_dir = daemon
    done = subprocess.run(libshare_run("--", sys.executable, "-c", CREATE_DEVICE), env=environment(pipe_dir),
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "honest: created",
        "geometry shader: VkErrorFeatureNotPresent",
        "geometry shader, features2: VkErrorFeatureNotPresent",
        "buffer device address: VkErrorFeatureNotPresent",
        "16-bit input/output: VkErrorFeatureNotPresent",
        "a second queue family: VkErrorInitializationFailed",
        "two queues: VkErrorInitializationFailed",
    ]
