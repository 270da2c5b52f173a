"""How to run an arbiter: its options, shared by ``libshare-control``, the control daemon and
``python -m libshare.arbiter``, and the exit statuses an arbiter process ends with.

Light on purpose: the CLI and the control daemon import it, and it imports nothing of the
engine, the device layer or Vulkan.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from libshare.protocol import paths as _config

__all__ = ["Options", "add_arguments", "STDERR_FILE", "EXIT_CANNOT_START", "EXIT_UNRECOVERABLE"]

STDERR_FILE = "arbiter.stderr"
"""File in the log directory that receives a background arbiter's standard error."""

EXIT_CANNOT_START = 1
"""Exit status of an arbiter that could not start (a bad option, no such device, the lock is taken)."""

EXIT_UNRECOVERABLE = 75  # EX_TEMPFAIL
"""Exit status of an arbiter whose device cannot be recovered in-process (a dispatch that never ends
outlived the watchdog and the recovery timeout): socket and lock are gone, start a new one."""

@dataclass(frozen=True)
class Options:
    """How to run an arbiter; the fields mirror the command-line options of :func:`add_arguments`."""

    pipe_directory: Path
    log_directory: Path
    device: str | None = None
    max_clients: int | None = None  # None: the configuration file's, else the arbiter's default (48)
    timestamps: bool = True
    placement: bool = True  # the engine and the driver's threads on a core of their own (_placement.py)
    multi_user: bool = False
    metrics_port: int = 0
    metrics_address: str = "127.0.0.1"
    shutdown_timeout: float = 10.0
    supervisor_fd: int = -1  # the control daemon's link (_supervisor.py), or -1; not in argv()
    config: Path | None = None  # the operator's configuration file (_settings.py)

    @classmethod
    def create(cls, pipe_directory=None, log_directory=None, config=None, **fields) -> Options:
        """Options with the pipe and log directories resolved from the LIBSHARE_* environment
        (and the configuration file's path made absolute: a daemon's children run in /)."""
        pipe = _config.pipe_directory(pipe_directory).absolute()
        logs = _config.log_directory(log_directory, pipe).absolute()
        return cls(pipe, logs, config=None if config is None else Path(config).absolute(), **fields)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Options:
        """Options from a namespace parsed by a parser that :func:`add_arguments` filled."""
        return cls.create(args.pipe_directory, args.log_directory, device=args.device,
                          max_clients=args.max_clients, timestamps=not args.no_timestamps,
                          placement=not args.no_placement and os.environ.get("LIBSHARE_PLACEMENT") != "0",
                          multi_user=args.multi_user, metrics_port=args.metrics_port,
                          metrics_address=args.metrics_address, shutdown_timeout=args.shutdown_timeout,
                          supervisor_fd=args.supervisor_fd, config=args.config)

    def argv(self) -> list[str]:
        """The command-line options that reproduce these options."""
        argv = ["--pipe-directory", str(self.pipe_directory), "--log-directory", str(self.log_directory),
                "--shutdown-timeout", str(self.shutdown_timeout)]
        if self.max_clients is not None:
            argv += ["--max-clients", str(self.max_clients)]
        if self.config is not None:
            argv += ["--config", str(self.config)]
        if self.device is not None:
            argv += ["--device", str(self.device)]
        if not self.timestamps:
            argv.append("--no-timestamps")
        if not self.placement:
            argv.append("--no-placement")
        if self.multi_user:
            argv.append("--multi-user")
        if self.metrics_port:
            argv += ["--metrics-port", str(self.metrics_port), "--metrics-address", self.metrics_address]
        return argv


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port 0..65535 (got {value})")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arbiter's options (shared by ``python -m libshare.arbiter`` and ``libshare-control``)."""
    group = parser.add_argument_group("arbiter options")
    group.add_argument("--pipe-directory", default=None,
                       help="where the control socket and lock file live (default: LIBSHARE_PIPE_DIRECTORY, "
                            "else $XDG_RUNTIME_DIR/libshare, else /tmp/libshare-$UID)")
    group.add_argument("--log-directory", default=None,
                       help="where server.log and control.log go (default: LIBSHARE_LOG_DIRECTORY, "
                            "else the pipe directory)")
    group.add_argument("--device", default=None, help="Vulkan device index or UUID (default: LIBSHARE_DEVICE, else 0)")
    group.add_argument("--max-clients", type=_positive_int, default=None,
                       help="clients served at once (default: max_clients of --config, else 48)")
    group.add_argument("--config", default=None, metavar="FILE",
                       help="the operator's configuration (TOML: [defaults] and [groups.NAME]; see docs/configuration.md); "
                            "read again on reload and SIGHUP")
    group.add_argument("--no-timestamps", action="store_true",
                       help="skip per-dispatch device timing (no device-time accounting; faster on lavapipe)")
    group.add_argument("--no-placement", action="store_true",
                       help="leave the engine's and the driver's threads on every core (by default, on a CPU "
                            "device, they share one core and the arbiter's other threads get the rest; "
                            "LIBSHARE_PLACEMENT=0 does the same)")
    group.add_argument("--multi-user", action="store_true",
                       help="serve clients of every user (run as root), not only the arbiter's own user")
    group.add_argument("--metrics-port", type=_port, default=0,
                       help="serve Prometheus metrics on this TCP port (default 0: off)")
    group.add_argument("--metrics-address", default="127.0.0.1", help="address of the metrics endpoint")
    group.add_argument("--shutdown-timeout", type=float, default=10.0,
                       help="seconds running work may take to end on SIGINT/SIGTERM (default 10)")
    group.add_argument("--supervisor-fd", type=int, default=-1, help=argparse.SUPPRESS)  # set by the control daemon
