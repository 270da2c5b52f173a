"""A simulated kubelet for the device plugin's tests: the real v1beta1 protocol over real Unix sockets.

``Kubelet`` serves ``Registration`` on ``kubelet.sock`` in a temporary device-plugin directory
and records each RegisterRequest; ``kubelet.plugin()`` is a DevicePlugin client on the socket
the plugin registered. ``run_plugin`` starts ``python -m libshare.k8s`` as its own process, as
a DaemonSet would.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import pytest

grpc = pytest.importorskip("grpc")

from libshare.k8s._stubs import api_pb2, api_pb2_grpc  # noqa: E402  (after the skip above)

from tests.conftest import ROOT, stop_process  # noqa: E402

DEADLINE = 60.0  # seconds any one expected event may take on a loaded 2-core machine
CHECKPOINT = "kubelet_internal_checkpoint"  # the kubelet's own file in the directory, which it keeps


class _Registration(api_pb2_grpc.RegistrationServicer):
    def __init__(self, requests: queue.Queue, refuse: bool):
        self._requests = requests
        self._refuse = refuse

    def Register(self, request, context):
        self._requests.put(request)
        if self._refuse:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, "resource name taken (the test says so)")
        return api_pb2.Empty()


class Kubelet:
    """The kubelet's side: Registration on ``directory/kubelet.sock``; a client of the registered plugin."""

    def __init__(self, directory: Path, refuse: bool = False):
        self.directory = directory
        self.socket = directory / "kubelet.sock"
        self.requests: queue.Queue = queue.Queue()
        self._channels = []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self.requests, refuse), self._server)
        self._server.add_insecure_port(f"unix:{self.socket}")
        self._server.start()

    def registration(self, timeout: float = DEADLINE) -> api_pb2.RegisterRequest:
        """The next RegisterRequest the plugin sends; fails the test after ``timeout`` seconds."""
        try:
            return self.requests.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"the plugin did not register within {timeout:g} s")

    def plugin(self, request: api_pb2.RegisterRequest) -> api_pb2_grpc.DevicePluginStub:
        """A DevicePlugin client on the endpoint ``request`` names, as the kubelet dials it."""
        channel = grpc.insecure_channel(f"unix:{self.directory / request.endpoint}")
        self._channels.append(channel)
        return api_pb2_grpc.DevicePluginStub(channel)

    def restart(self) -> "Kubelet":
        """What a kubelet restart does to the directory: its server goes, every file in it but its
        checkpoint is removed (the plugins' sockets with the rest; directories stay), and a new
        kubelet serves a new kubelet.sock."""
        self.stop()
        for entry in self.directory.iterdir():
            if entry.name != CHECKPOINT and not entry.is_dir():
                entry.unlink()
        return Kubelet(self.directory)

    def stop(self) -> None:
        for channel in self._channels:
            channel.close()
        self._server.stop(grace=None).wait()


@pytest.fixture
def kubelet(tmp_path):
    directory = tmp_path / "dp"
    directory.mkdir()
    kubelet = Kubelet(directory)
    yield kubelet
    kubelet.stop()


@contextmanager
def run_plugin(kubelet_socket: Path, pipe_dir: Path, *args: str):
    """``python -m libshare.k8s`` against ``kubelet_socket`` and the arbiter at ``pipe_dir``, polling every
    0.1 s, for the ``with`` block; it must exit 0 on SIGTERM at the end."""
    log_path = pipe_dir.parent / "plugin.stderr"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "libshare.k8s", "--kubelet-socket", str(kubelet_socket),
             "--pipe-directory", str(pipe_dir), "--health-period", "0.1", *args],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, env={**os.environ})
    try:
        yield process
    finally:
        stop_process(process)
        assert process.returncode == 0, f"the plugin exited with {process.returncode}: {log_path.read_text()[-3000:]}"


def next_listing(stream, predicate=lambda listing: True, what: str = "a device list"):
    """Read ``stream`` (a ListAndWatch call with a deadline) until a listing satisfies ``predicate``."""
    for listing in stream:
        if predicate(listing):
            return listing
    pytest.fail(f"the ListAndWatch stream ended before {what}")


def health(listing) -> set[str]:
    return {device.health for device in listing.devices}


def allocate(stub, *containers, timeout: float = DEADLINE):
    """The kubelet's Allocate of one container request per list of device ids in ``containers``."""
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in containers])
    return stub.Allocate(request, timeout=timeout)


def healthy(stream):
    """The next listing of ``stream`` in which every share is Healthy."""
    return next_listing(stream, lambda listing: health(listing) == {"Healthy"}, "every share Healthy")


def unhealthy(stream):
    """The next listing of ``stream`` in which every share is Unhealthy."""
    return next_listing(stream, lambda listing: health(listing) == {"Unhealthy"}, "every share Unhealthy")
