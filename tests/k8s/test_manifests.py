"""contrib/kubernetes: the DaemonSet runs commands the arbiter and the plugin take, on the paths they use."""

from __future__ import annotations

import json
import re

from libshare.control import _parser as control_parser
from libshare.k8s import parse_shares
from libshare.k8s._cli import _parser as plugin_parser

from tests.conftest import ROOT

CONTRIB = ROOT / "contrib" / "kubernetes"


def _commands(text: str) -> list[list[str]]:
    """Every ``command: [...]`` flow sequence (the manifests write them as JSON arrays)."""
    return [json.loads(match) for match in re.findall(r"command: (\[[^\]]*\])", text)]


def test_the_daemonset_runs_the_arbiter_and_the_plugin_on_one_pipe_directory():
    text = (CONTRIB / "daemonset.yaml").read_text()
    control = [control_parser().parse_args(c[1:]) for c in _commands(text) if c[0] == "libshare-control"]
    (arbiter,) = [args for args in control if args.foreground]
    assert arbiter.multi_user and not arbiter.command
    assert sorted(args.command[0] for args in control if args.command) == ["get_server_status", "quit"]
    (plugin,) = [plugin_parser().parse_args(c[1:]) for c in _commands(text) if c[0] == "libshare-k8s-device-plugin"]
    assert plugin.pipe_directory == "/run/libshare" and len(parse_shares(plugin.shares)) == 10
    assert plugin.kubelet_socket == "/var/lib/kubelet/device-plugins/kubelet.sock"
    for path in ("/var/lib/kubelet/device-plugins", "/run/libshare"):
        assert f"hostPath: {{path: {path}," in text and f"mountPath: {path}}}" in text
    assert "hostPID: true" in text and "value: /run/libshare}" in text


def test_the_example_pod_asks_for_the_plugins_resource():
    text = (CONTRIB / "example-pod.yaml").read_text()
    assert "limits: {libshare.io/vulkan: 3}" in text
    assert plugin_parser().get_default("resource_name") == "libshare.io/vulkan"
