"""A plugin restart under running pods: the allocations outlive the plugin (its ledger, _ledger.py).

Reviewed (issue 32): the plugin kept its allocations in memory only. After a restart,
allocating some of an old allocation's devices left the old group's share socket open, and an
arbiter crash or ``restart`` after it took the running pods' share sockets and group limits
with it: a pod's session ended ArbiterLost. Here, under a control daemon, two pods stream
checked dispatches through their share sockets (tests/arbiter/_streaming_client.py: a wrong
result or a lost session ends it with status 1) while the plugin restarts, some old devices are
allocated again, and the arbiter is SIGKILLed and then restarted.
"""

from __future__ import annotations

import os
import signal

import pytest

grpc = pytest.importorskip("grpc")

from libshare.protocol.control import ControlConnection  # noqa: E402
from libshare.k8s._stubs import api_pb2  # noqa: E402

from tests._wait import wait_until  # noqa: E402
from tests.arbiter.test_reattach import Daemon  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.k8s._pod import Pod  # noqa: E402
from tests.k8s.conftest import DEADLINE, allocate, healthy, run_plugin  # noqa: E402

EMPTY = api_pb2.Empty()
SHARES = ("--shares", "4", "--memory-per-share", "64M")


def _control(daemon: Daemon, *command: str) -> str:
    with ControlConnection(daemon.pipe, timeout=30) as connection:
        return connection.run(*command)


def _arbiter_owes(daemon: Daemon, groups: set[str]) -> None:
    """Wait for the arbiter serving now to have exactly ``groups``' share sockets, then check their limits."""
    wait_until(lambda: set(_control(daemon, "get_share_list").split()) == groups, DEADLINE,
               lambda: f"the share sockets of {sorted(groups)} (open: {_control(daemon, 'get_share_list')!r})")
    for group in groups:
        assert _control(daemon, "get_group_mem_limit", group) == "64M"


def _end_and_recover(daemon: Daemon, pods: list[Pod], end_arbiter) -> int:
    old = daemon.arbiter()
    end_arbiter(old)
    wait_until(lambda: daemon.arbiter() not in (old, None), 120, "the next arbiter")
    new = daemon.arbiter()
    for pod in pods:
        _wait_served(pod, new)
    return new


def _wait_served(pod: Pod, arbiter: int) -> None:
    wait_until(lambda: pod.served_at(arbiter) is not None or pod.ended(), 120,
               f"a dispatch of group {pod.group} on arbiter {arbiter}")
    if pod.served_at(arbiter) is None:
        pytest.fail(f"the pod of group {pod.group} ended before a dispatch on arbiter {arbiter}: {pod.why()}")


def test_a_plugin_restart_under_running_pods_keeps_their_groups(kubelet, tmp_path, vulkan_device_name):
    daemon = Daemon(tmp_path / "pipe")
    pods: list[Pod] = []
    try:
        with run_plugin(kubelet.socket, daemon.pipe, *SHARES):
            plugin = kubelet.plugin(kubelet.registration())
            healthy(plugin.ListAndWatch(EMPTY, timeout=DEADLINE))
            old, *running = allocate(plugin, ["share-0", "share-1"], ["share-2"], ["share-3"]).container_responses
            pods = [Pod(response, tmp_path / f"pod-{number}.stderr", ROOT) for number, response in enumerate(running)]
            for pod in pods:
                _wait_served(pod, daemon.arbiter())
        # The plugin is gone (SIGTERM, as a DaemonSet upgrade does); the pods run on.
        with run_plugin(kubelet.socket, daemon.pipe, *SHARES):
            plugin = kubelet.plugin(kubelet.registration())
            healthy(plugin.ListAndWatch(EMPTY, timeout=DEADLINE))
            again = allocate(plugin, ["share-1"]).container_responses[0]  # one of the old group's devices
            groups = {pod.group for pod in pods} | {again.envs["LIBSHARE_GROUP"]}
            _arbiter_owes(daemon, groups)  # the old group's share socket is closed,
            assert _control(daemon, "get_group_mem_limit", old.envs["LIBSHARE_GROUP"]) == "unlimited"  # its limit lifted

            _end_and_recover(daemon, pods, lambda pid: os.kill(pid, signal.SIGKILL))
            _arbiter_owes(daemon, groups)  # the new arbiter was given the groups the restarted plugin kept
            _end_and_recover(daemon, pods, lambda pid: _control(daemon, "restart"))
            _arbiter_owes(daemon, groups)
        for pod in pods:
            end = pod.finish()
            assert end["reattached"] == 2 and end["same_arrays"] and end["ok"] > 0, end
    finally:
        for pod in pods:
            pod.stop()
        daemon.stop()
