"""The long device-plugin run (issue 32): a plugin restart under running pods, then arbiter crashes.

Run from the repository root (or against another tree, whose ``libshare`` and ``tests`` are then
used, subprocesses included: ``PYTHONPATH=/tmp/before python tools/attack_k8s.py``)::

    .venv/bin/python tools/attack_k8s.py --pods 4 --rounds 2

With a simulated kubelet (tests/k8s/conftest.py: the real gRPC protocol over Unix sockets), a
control daemon and its arbiter on lavapipe, and ``--pods`` pods (tests/k8s/_pod.py: processes
with the allocated environment, streaming checked dispatches through their share sockets):

1. allocates an "old" group of two shares and one share to each pod, then restarts the plugin
   (SIGTERM and a new process; ``--no-plugin-restart`` keeps the first, for comparison) and
   allocates one of the old group's shares again: is the old group's share socket closed?
2. ``--rounds`` times, SIGKILLs the arbiter and then ``restart``s it; for each, every pod is
   "recovered" (a checked dispatch on the new arbiter) or "lost" (its session ended), with how
   long after the kill or the command its first dispatch there succeeded, and whether the new
   arbiter holds the pods' share sockets and group memory limits;
3. asks a plugin whose arbiter is down to Allocate a share (Unhealthy): answered, or refused?
4. starts a plugin with ``--shares 50%:8G,25%,25%`` and, if it runs, allocates share-0 and
   share-1 together: which memory limit does the container get?

It prints one JSON object of figures (and progress lines on stderr).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.append(str(HERE))  # after PYTHONPATH: the tree under test gives libshare and tests

import grpc  # noqa: E402

import libshare  # noqa: E402
from libshare.protocol.control import ControlConnection  # noqa: E402
from libshare.k8s._stubs import api_pb2  # noqa: E402
from tests.arbiter.test_reattach import Daemon  # noqa: E402
from tests.conftest import ROOT  # noqa: E402  (the tree under test: the pods and plugins run from it)
from tests.k8s.conftest import Kubelet, run_plugin  # noqa: E402

_spec = importlib.util.spec_from_file_location("_attack_pod", HERE / "tests" / "k8s" / "_pod.py")
_pod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_pod)

EMPTY = api_pb2.Empty()
WAIT = 60.0  # seconds for any one expected event; a pod not back by then counts as lost


def progress(message: str) -> None:
    print(f"[attack_k8s] {message}", file=sys.stderr, flush=True)


def poll(predicate, timeout: float = WAIT, interval: float = 0.02):
    """``predicate()`` once it is true, or its last value after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(interval)
    return value


def allocate(plugin, *containers):
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in containers])
    return plugin.Allocate(request, timeout=WAIT).container_responses


def wait_healthy(plugin) -> None:
    for listing in plugin.ListAndWatch(EMPTY, timeout=WAIT):
        if {device.health for device in listing.devices} == {"Healthy"}:
            return


def control(pipe: Path, *command: str) -> str:
    with ControlConnection(pipe, timeout=30) as connection:
        return connection.run(*command)


def end_arbiter(daemon: Daemon, pods: list, how: str) -> dict:
    """SIGKILL or ``restart`` the arbiter; each pod's outcome on the next one, and what that one holds."""
    old = daemon.arbiter()
    start = time.monotonic()
    if how == "SIGKILL":
        os.kill(old, signal.SIGKILL)
    else:
        control(daemon.pipe, "restart")
    poll(lambda: daemon.arbiter() not in (old, None), 120)
    new = daemon.arbiter()
    outcomes, gaps, lost = [], [], set()
    for pod in pods:
        poll(lambda: pod.served_at(new) is not None or pod.ended())
        served = pod.served_at(new)
        outcomes.append("recovered" if served is not None else "lost")
        if served is not None:
            gaps.append(served - start)
        else:  # the exception that ended its session (the last line of its standard error)
            lost.add((pod.log_path.read_text().strip().splitlines() or ["still running"])[-1][:160])
    shares = set(control(daemon.pipe, "get_share_list").split())
    limits = [control(daemon.pipe, "get_group_mem_limit", pod.group) for pod in pods]
    figures = {"end": how, "recovered": outcomes.count("recovered"), "lost": outcomes.count("lost"),
               "longest_gap_s": round(max(gaps), 3) if gaps else None, "lost_with": sorted(lost),
               "all_lost_within_s": round(time.monotonic() - start, 1) if lost and not gaps else None,
               "pod_shares_open": sum(pod.group in shares for pod in pods),
               "pod_limits_set": sum(limit == "64M" for limit in limits)}
    progress(f"{how}: {figures}")
    return figures


def restart_under_pods(root: Path, kubelet: Kubelet, count: int, rounds: int, restart_plugin: bool) -> dict:
    daemon = Daemon(root / "pipe")
    pods = []
    args = ("--shares", str(count + 2), "--memory-per-share", "64M")
    try:
        with run_plugin(kubelet.socket, daemon.pipe, *args):
            plugin = kubelet.plugin(kubelet.registration())
            wait_healthy(plugin)
            old, *running = allocate(plugin, [f"share-{count}", f"share-{count + 1}"],
                                     *([f"share-{i}"] for i in range(count)))
            pods = [_pod.Pod(response, root / f"pod-{i}.stderr", ROOT) for i, response in enumerate(running)]
            first = daemon.arbiter()
            poll(lambda: all(pod.served_at(first) is not None or pod.ended() for pod in pods), 120)
            progress(f"{count} pods streaming on arbiter {first}")
            if not restart_plugin:
                return _after_restart(daemon, plugin, pods, old, count, rounds)
        with run_plugin(kubelet.socket, daemon.pipe, *args):
            plugin = kubelet.plugin(kubelet.registration())
            wait_healthy(plugin)
            progress("plugin restarted")
            return _after_restart(daemon, plugin, pods, old, count, rounds)
    finally:
        for pod in pods:
            pod.stop()
        daemon.stop()


def _after_restart(daemon: Daemon, plugin, pods: list, old, count: int, rounds: int) -> dict:
    old_group = old.envs["LIBSHARE_GROUP"]
    allocate(plugin, [f"share-{count + 1}"])
    retired = bool(poll(lambda: old_group not in control(daemon.pipe, "get_share_list").split(), 10))
    figures = {"old_group_share_closed": retired,
               "old_group_limit": control(daemon.pipe, "get_group_mem_limit", old_group), "ends": []}
    progress(f"one of the old group's shares allocated again: its share socket closed: {retired}")
    for _ in range(rounds):
        for how in ("SIGKILL", "restart"):
            figures["ends"].append(end_arbiter(daemon, pods, how))
    return figures


def unhealthy_allocate(root: Path, kubelet: Kubelet) -> str:
    with run_plugin(kubelet.socket, root / "no-arbiter", "--shares", "2", "--resource-name", "example.com/down"):
        plugin = kubelet.plugin(kubelet.registration())
        try:
            response = allocate(plugin, ["share-0"])[0]
        except grpc.RpcError as exc:
            return f"refused {exc.code().name}: {exc.details()}"
        return f"accepted: LIBSHARE_GROUP={response.envs['LIBSHARE_GROUP']}"


def mixed_allocation(root: Path, kubelet: Kubelet) -> str:
    daemon = Daemon(root / "mixed-pipe")
    command = [sys.executable, "-m", "libshare.k8s", "--kubelet-socket", str(kubelet.socket), "--pipe-directory",
               str(daemon.pipe), "--health-period", "0.1", "--shares", "50%:8G,25%,25%",
               "--resource-name", "example.com/mixed"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        if poll(lambda: process.poll() is not None or not kubelet.requests.empty(), WAIT) and process.poll() is not None:
            return f"refused at the start (status {process.returncode}): {(process.stderr.read().strip().splitlines() or [''])[-1][-300:]}"
        plugin = kubelet.plugin(kubelet.registration())
        wait_healthy(plugin)
        response = allocate(plugin, ["share-0", "share-1"])[0]
        limit = control(daemon.pipe, "get_group_mem_limit", response.envs["LIBSHARE_GROUP"])
        return (f"share-0 (8G) with share-1 (no memory): LIBSHARE_DEVICE_MEM_LIMIT="
                f"{response.envs.get('LIBSHARE_DEVICE_MEM_LIMIT', 'unset')}, group limit {limit}")
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(30)
        process.stderr.close()
        daemon.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=4, help="running pods during the plugin restart (default 4)")
    parser.add_argument("--rounds", type=int, default=1, help="SIGKILL-then-restart rounds after it (default 1)")
    parser.add_argument("--no-plugin-restart", action="store_true", help="keep the first plugin (the baseline)")
    args = parser.parse_args()
    progress(f"libshare from {libshare.__file__}; tests from {ROOT}")
    with tempfile.TemporaryDirectory(prefix="attack-k8s-") as directory:
        root = Path(directory)
        (root / "dp").mkdir()
        kubelet = Kubelet(root / "dp")
        try:
            figures = {"libshare": libshare.__file__, "pods": args.pods,
                       "plugin_restarted": not args.no_plugin_restart,
                       "restart_under_pods": restart_under_pods(root, kubelet, args.pods, args.rounds,
                                                                not args.no_plugin_restart),
                       "unhealthy_allocate": unhealthy_allocate(root, kubelet),
                       "mixed_allocation": mixed_allocation(root, kubelet)}
        finally:
            kubelet.stop()
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
