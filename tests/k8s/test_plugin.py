"""The device plugin against a simulated kubelet (real gRPC, real Unix sockets) and a real arbiter."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys

import pytest

grpc = pytest.importorskip("grpc")

from libshare.protocol import control as _control  # noqa: E402
from libshare.k8s import group_name  # noqa: E402
from libshare.k8s._stubs import api_pb2  # noqa: E402

from tests.arbiter.conftest import run_daemon, wait_until  # noqa: E402
from tests.conftest import ROOT, stop_process  # noqa: E402
from tests.k8s.conftest import DEADLINE, Kubelet, health, run_plugin  # noqa: E402
from tests.k8s.conftest import allocate as _allocate, healthy as _healthy, unhealthy as _unhealthy  # noqa: E402

arbiter = contextlib.contextmanager(run_daemon)
EMPTY = api_pb2.Empty()


def test_registers_and_lists_its_shares_unhealthy_without_an_arbiter(kubelet, tmp_path):
    with run_plugin(kubelet.socket, tmp_path / "pipe", "--shares", "4"):
        request = kubelet.registration()
        assert (request.version, request.resource_name) == ("v1beta1", "libshare.io/vulkan")
        assert request.endpoint == "libshare-vulkan.sock" and (kubelet.directory / request.endpoint).is_socket()
        assert not request.options.pre_start_required and not request.options.get_preferred_allocation_available
        plugin = kubelet.plugin(request)
        assert plugin.GetDevicePluginOptions(EMPTY, timeout=DEADLINE) == request.options
        stream = plugin.ListAndWatch(EMPTY, timeout=DEADLINE)
        listing = next(stream)
        assert [device.ID for device in listing.devices] == ["share-0", "share-1", "share-2", "share-3"]
        assert health(listing) == {"Unhealthy"}
        stream.cancel()


def _refused_as_unhealthy(plugin, *devices) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        _allocate(plugin, list(devices))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "Unhealthy" in refused.value.details() and "not ACTIVE" in refused.value.details()


def test_shares_are_unhealthy_while_the_arbiter_is_down_and_are_not_allocated(kubelet, tmp_path,
                                                                            vulkan_device_name):
    """Reviewed: an Allocate of an Unhealthy share was answered, for a container whose group limits no
    arbiter had. It is refused with a gRPC error (the kubelet fails the pod's admission), and
    answered again, limits set at once, when the share is Healthy."""
    pipe = tmp_path / "pipe"
    with run_plugin(kubelet.socket, pipe, "--shares", "3", "--memory-per-share", "32M"):
        plugin = kubelet.plugin(kubelet.registration())
        stream = plugin.ListAndWatch(EMPTY, timeout=10 * DEADLINE)
        assert health(next(stream)) == {"Unhealthy"}
        _refused_as_unhealthy(plugin, "share-0")
        with arbiter(pipe):
            listing = _healthy(stream)
            assert len(listing.devices) == 3
            group = _allocate(plugin, ["share-1"]).container_responses[0].envs["LIBSHARE_GROUP"]
            with _control.ControlConnection(pipe) as control:
                assert control.run("get_group_mem_limit", group) == "32M"
                assert control.run("get_share_list") == group
        _unhealthy(stream)  # SIGTERM: the arbiter left; the plugin streamed the change by itself
        _refused_as_unhealthy(plugin, "share-0", "share-2")
        with arbiter(pipe):
            _healthy(stream)
            _allocate(plugin, ["share-2"])
        _unhealthy(stream)
        stream.cancel()


def test_registers_again_when_the_kubelet_restarts(kubelet, tmp_path):
    with run_plugin(kubelet.socket, tmp_path / "pipe", "--shares", "2", "--resource-name", "example.com/gpu-share"):
        first = kubelet.registration()
        assert first.endpoint == "libshare-gpu-share.sock"
        assert len(next(kubelet.plugin(first).ListAndWatch(EMPTY, timeout=DEADLINE)).devices) == 2
        restarted = kubelet.restart()  # the plugin's socket is removed with the old kubelet's
        try:
            second = restarted.registration()
            assert second == first
            listing = next(restarted.plugin(second).ListAndWatch(EMPTY, timeout=DEADLINE))
            assert [device.ID for device in listing.devices] == ["share-0", "share-1"]
        finally:
            restarted.stop()


def test_registration_is_tried_again_when_the_kubelet_refuses(tmp_path):
    directory = tmp_path / "dp"
    directory.mkdir()
    refusing = Kubelet(directory, refuse=True)
    try:
        with run_plugin(refusing.socket, tmp_path / "pipe"):
            assert refusing.registration() == refusing.registration()
    finally:
        refusing.stop()


def test_allocate_gives_the_shares_environment_mount_and_group_limits(kubelet, tmp_path, vulkan_device_name):
    pipe = tmp_path / "pipe"
    with arbiter(pipe), run_plugin(kubelet.socket, pipe, "--shares", "8", "--memory-per-share", "256M"):
        plugin = kubelet.plugin(kubelet.registration())
        stream = plugin.ListAndWatch(EMPTY, timeout=DEADLINE)
        _healthy(stream)
        def mount(group: str) -> api_pb2.Mount:  # the group's share directory, where the container looks
            return api_pb2.Mount(container_path=str(pipe), host_path=str(pipe / "shares" / group), read_only=True)

        one, three = _allocate(plugin, ["share-7"], ["share-2", "share-0", "share-5"]).container_responses
        assert dict(one.envs) == {"LIBSHARE_PIPE_DIRECTORY": str(pipe), "LIBSHARE_MODE": "daemon",
                                  "LIBSHARE_ACTIVE_THREAD_PERCENTAGE": "12", "LIBSHARE_DEVICE_MEM_LIMIT": str(256 << 20),
                                  "LIBSHARE_GROUP": group_name(["share-7"])}
        assert dict(three.envs) == {**one.envs, "LIBSHARE_ACTIVE_THREAD_PERCENTAGE": "37",
                                    "LIBSHARE_DEVICE_MEM_LIMIT": str(768 << 20),
                                    "LIBSHARE_GROUP": group_name(["share-0", "share-2", "share-5"])}
        assert list(one.mounts) == [mount(one.envs["LIBSHARE_GROUP"])]
        assert list(three.mounts) == [mount(three.envs["LIBSHARE_GROUP"])]
        assert not one.devices and not one.cdi_devices
        everything = _allocate(plugin, [f"share-{i}" for i in range(8)]).container_responses[0]
        assert everything.envs["LIBSHARE_ACTIVE_THREAD_PERCENTAGE"] == "100"
        assert everything.envs["LIBSHARE_DEVICE_MEM_LIMIT"] == str(2 << 30)

        with _control.ControlConnection(pipe) as control:
            # All eight shares went to one container since: the two groups before it were lifted.
            assert control.run("get_group_mem_limit", everything.envs["LIBSHARE_GROUP"]) == "2G"
            assert control.run("get_group_mem_limit", three.envs["LIBSHARE_GROUP"]) == "unlimited"
            assert control.run("get_share_list") == everything.envs["LIBSHARE_GROUP"]  # the others' closed
            again = _allocate(plugin, ["share-5", "share-2", "share-0"]).container_responses[0]
            assert dict(again.envs) == dict(three.envs)  # the same devices, in any order: the same group
            assert control.run("get_group_mem_limit", again.envs["LIBSHARE_GROUP"]) == "768M"
            assert control.run("get_group_mem_limit", everything.envs["LIBSHARE_GROUP"]) == "unlimited"

            # A process of the container, which finds its share directory at the pipe directory (no
            # mount here: it is given the host's path): the environment is the client's own limits.
            client = subprocess.Popen(
                [sys.executable, "-c", "import sys, libshare\nwith libshare.connect(name='pod'):\n"
                 "    print('ready', flush=True); sys.stdin.read()"],
                cwd=ROOT, env={"PATH": "/usr/bin:/bin", **dict(again.envs),
                               "LIBSHARE_PIPE_DIRECTORY": again.mounts[0].host_path}, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True)
            try:
                assert client.stdout.readline() == "ready\n"
                pid = str(client.pid)
                wait_until(lambda: pid in control.run("get_client_list").split(), DEADLINE, "the client in the list")
                assert control.run("get_active_thread_percentage", pid) == "37"
                assert control.run("get_device_pinned_mem_limit", pid, "0").startswith("768M ")
            finally:
                client.stdin.close()
                stop_process(client)
                client.stdout.close()


CONTAINED = """
import json, sys, numpy as np, libshare
from libshare.protocol.control import ControlConnection
out = {}
with libshare.connect(name="rogue") as s:  # LIBSHARE_GROUP dropped, a whole device and no memory limit asked for
    try:
        s.array(96 << 20, np.uint8)  # past the allocation's 64M group limit
        out["big"] = "allocated"
    except libshare.LibshareError as exc:
        out["big"] = type(exc).__name__
    print(json.dumps(out), flush=True)
    sys.stdin.read()
lift = lambda: ControlConnection(sys.argv[1]).run("set_group_mem_limit", sys.argv[2], "unlimited")
for name, attempt in (("group", lambda: libshare.connect(group="someone-else")),
                      ("priority", lambda: libshare.connect(priority="realtime")), ("control", lift)):
    try:
        attempt()
        out[name] = "taken"
    except libshare.LibshareError as exc:
        out[name] = type(exc).__name__
print(json.dumps(out), flush=True)
"""


def test_a_container_cannot_leave_its_allocation_through_its_environment(kubelet, tmp_path, vulkan_device_name):
    """Reviewed as a hostile container: it dropped LIBSHARE_GROUP and its limits from its environment,
    and got 73% of the device against a 20% grant and 300M against 100M; as root it was the arbiter's
    operator. Its mount is now its group's share socket, which holds it to the group whatever it asks."""
    pipe = tmp_path / "pipe"
    with arbiter(pipe), run_plugin(kubelet.socket, pipe, "--shares", "4", "--memory-per-share", "64M"):
        plugin = kubelet.plugin(kubelet.registration())
        _healthy(plugin.ListAndWatch(EMPTY, timeout=DEADLINE))
        response = _allocate(plugin, ["share-1"]).container_responses[0]
        group, share_dir = response.envs["LIBSHARE_GROUP"], response.mounts[0].host_path
        env = {"PATH": "/usr/bin:/bin", "LIBSHARE_MODE": "daemon", "LIBSHARE_PIPE_DIRECTORY": share_dir,
               "LIBSHARE_ACTIVE_THREAD_PERCENTAGE": "100"}
        rogue = subprocess.Popen([sys.executable, "-c", CONTAINED, share_dir, group], cwd=ROOT, env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert json.loads(rogue.stdout.readline()) == {"big": "QuotaExceeded"}
            rogue.stdin.close()
            assert json.loads(rogue.stdout.readline()) == {"big": "QuotaExceeded", "group": "AccessDenied",
                                                           "priority": "AccessDenied", "control": "AccessDenied"}
        finally:
            stop_process(rogue)
            rogue.stdout.close()
        with _control.ControlConnection(pipe) as control:
            assert control.run("get_group_mem_limit", group) == "64M"


def test_uneven_and_single_shares(kubelet, tmp_path, vulkan_device_name):
    pipe = tmp_path / "pipe"
    with arbiter(pipe), run_plugin(kubelet.socket, pipe, "--shares", "50%:1G,30%,20%", "--memory-per-share", "100M"):
        plugin = kubelet.plugin(kubelet.registration())
        _healthy(plugin.ListAndWatch(EMPTY, timeout=DEADLINE))
        small, big = _allocate(plugin, ["share-2"], ["share-0", "share-1"]).container_responses
        assert (small.envs["LIBSHARE_ACTIVE_THREAD_PERCENTAGE"], small.envs["LIBSHARE_DEVICE_MEM_LIMIT"]) == \
            ("20", str(100 << 20))
        assert (big.envs["LIBSHARE_ACTIVE_THREAD_PERCENTAGE"], big.envs["LIBSHARE_DEVICE_MEM_LIMIT"]) == \
            ("80", str((1 << 30) + (100 << 20)))
        assert small.envs["LIBSHARE_GROUP"] != big.envs["LIBSHARE_GROUP"]
    with arbiter(pipe), run_plugin(kubelet.socket, pipe, "--shares", "1"):
        plugin = kubelet.plugin(kubelet.registration())
        _healthy(plugin.ListAndWatch(EMPTY, timeout=DEADLINE))
        whole = _allocate(plugin, ["share-0"]).container_responses[0]
        assert whole.envs["LIBSHARE_ACTIVE_THREAD_PERCENTAGE"] == "100"
        assert "LIBSHARE_DEVICE_MEM_LIMIT" not in whole.envs


def test_a_plugin_with_shares_with_and_without_memory_does_not_start(kubelet, tmp_path):
    """Reviewed: with --shares 50%:8G,25%,25% a container allocated share-0 and share-1 got no memory
    limit (the share without memory removed the 8G cap). Such a list is refused at the start."""
    result = subprocess.run([sys.executable, "-m", "libshare.k8s", "--kubelet-socket", str(kubelet.socket),
                             "--pipe-directory", str(tmp_path / "pipe"), "--shares", "50%:8G,25%,25%"],
                            cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE)
    assert result.returncode == 2 and "shares with and without memory are mixed" in result.stderr
    assert kubelet.requests.empty() and not (kubelet.directory / "libshare-vulkan.sock").exists()


@pytest.mark.parametrize("containers, complaint", [
    ((), "no container request"),
    (([],), "names no device"),
    ((["share-9"],), "unknown device id"),
    ((["share-0", "gpu-0"],), "unknown device id"),
    ((["share-1", "share-1"],), "more than once"),
    ((["share-0"], ["share-0", "share-1"]), "requested by two containers"),
])
def test_bad_allocations_are_refused(kubelet, tmp_path, containers, complaint):
    with run_plugin(kubelet.socket, tmp_path / "pipe", "--shares", "4"):
        plugin = kubelet.plugin(kubelet.registration())
        with pytest.raises(grpc.RpcError) as refused:
            _allocate(plugin, *containers)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and complaint in refused.value.details()
        _refused_as_unhealthy(plugin, "share-3")  # a good request, checked, and refused: there is no arbiter


def test_the_calls_it_does_not_offer(kubelet, tmp_path):
    with run_plugin(kubelet.socket, tmp_path / "pipe", "--shares", "2"):
        plugin = kubelet.plugin(kubelet.registration())
        request = api_pb2.PreferredAllocationRequest(container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=["share-0", "share-1"], allocation_size=1)])
        with pytest.raises(grpc.RpcError) as refused:
            plugin.GetPreferredAllocation(request, timeout=DEADLINE)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert plugin.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=["share-1"]),
                                        timeout=DEADLINE) == api_pb2.PreStartContainerResponse()
        with pytest.raises(grpc.RpcError) as refused:
            plugin.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=["nope"]), timeout=DEADLINE)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
