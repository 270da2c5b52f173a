"""The command line of ``python -m libshare.k8s`` and ``libshare-k8s-device-plugin``: run the plugin until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from libshare.protocol import paths as _config
from libshare.k8s._plugin import KUBELET_SOCKET, DevicePlugin, Options
from libshare.k8s._shares import DEFAULT_RESOURCE, parse_memory, parse_shares


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="libshare-k8s-device-plugin",
        description="Kubernetes device plugin (API v1beta1): advertise shares of the libshare arbiter at a pipe "
                    "directory as devices of one extended resource. A container that is allocated K shares gets "
                    "the pipe directory mounted (read-only) and LIBSHARE_PIPE_DIRECTORY, LIBSHARE_MODE=daemon, "
                    "LIBSHARE_ACTIVE_THREAD_PERCENTAGE (the shares' sum, at most 100), LIBSHARE_DEVICE_MEM_LIMIT "
                    "(when shares have memory) and LIBSHARE_GROUP (one group per allocation, whose limits the "
                    "plugin sets on the arbiter). Shares are Unhealthy while the arbiter is not ACTIVE, and an "
                    "Unhealthy share is not allocated. The allocations are kept in a ledger, a file in a libshare "
                    "directory beside the kubelet socket, so that they outlive a restart of the plugin.")
    parser.add_argument("--shares", default="10",
                        help="N equal shares (1..100; default 10, each 10%%), or a list of whole percentages adding "
                             "up to at most 100, each optionally with its memory: 50%%:8G,25%%:4G,25%%:4G; "
                             "100%% is a single share of the whole device. Either every share has memory (its "
                             "own or --memory-per-share; an allocation gets their sum) or none has")
    parser.add_argument("--memory-per-share", type=parse_memory, metavar="SIZE",
                        help="device memory each share brings (like 512M or 2G), for shares without their own; "
                             "default: no memory limit")
    parser.add_argument("--pipe-directory", default=None,
                        help="the arbiter's pipe directory as this plugin sees it (default: LIBSHARE_PIPE_DIRECTORY, "
                             "else the per-user default)")
    parser.add_argument("--host-pipe-directory", default=None,
                        help="the same directory's path on the node, mounted at that path into containers "
                             "(default: --pipe-directory)")
    parser.add_argument("--kubelet-socket", default=str(KUBELET_SOCKET),
                        help="the kubelet's registration socket; the plugin's own socket goes beside it "
                             "(default: %(default)s)")
    parser.add_argument("--resource-name", default=DEFAULT_RESOURCE,
                        help="the extended resource pods ask for (default: %(default)s)")
    parser.add_argument("--socket-name", default=None,
                        help="file name of the plugin's socket in the kubelet's directory "
                             "(default: libshare-NAME.sock from the resource name)")
    parser.add_argument("--health-period", type=float, default=1.0, metavar="SECONDS",
                        help="how often the arbiter's state and the kubelet's socket are looked at (default: 1)")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the plugin in the foreground; returns its exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="[%(asctime)s %(process)d] %(levelname)s %(message)s")
    try:
        options = Options(parse_shares(args.shares, args.memory_per_share),
                          pipe_directory=_config.pipe_directory(args.pipe_directory),
                          host_pipe_directory=args.host_pipe_directory, kubelet_socket=args.kubelet_socket,
                          resource_name=args.resource_name, socket_name=args.socket_name,
                          period=args.health_period)
    except ValueError as exc:
        parser.error(str(exc))
    stop_signal = _stop_signal()
    try:
        plugin = DevicePlugin(options).start()
    except OSError as exc:
        print(f"libshare-k8s-device-plugin: {exc}", file=sys.stderr)
        return 1
    logging.getLogger("libshare.k8s").info(
        "shares: %s", ", ".join(share.describe() for share in options.shares))
    try:
        os.read(stop_signal, 1)  # until SIGTERM or SIGINT
    finally:
        plugin.stop()
    return 0


def _stop_signal() -> int:
    """A descriptor that becomes readable on SIGTERM or SIGINT.

    The handlers do nothing in Python: the interpreter writes the signal's number to the
    wakeup pipe. A handler that set a threading.Event could deadlock: it runs on the main
    thread, which may hold that Event's lock at that moment (inside Event.wait), and then the
    plugin never exits (seen twice under load: killed 20 s after SIGTERM)."""
    readable, writable = os.pipe()
    os.set_blocking(writable, False)
    signal.set_wakeup_fd(writable)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)
    return readable
