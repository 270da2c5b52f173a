"""How to run an arbiter: its options, shared by ``libshare-control``, the control daemon and
``python -m libshare.arbiter``, and the exit statuses an arbiter process ends with.

Light on purpose: the CLI and the control daemon import it, and it imports nothing of the
engine, the device layer or Vulkan.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from libshare import settings as _settings
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
    max_clients: int | None = None  # None: the configuration file's, else the settings table's default
    timestamps: bool = _settings.default("timestamps")
    placement: bool = _settings.default("placement")  # the engine and the driver's threads on a core (placement.py)
    multi_user: bool = _settings.default("multi_user")
    metrics_port: int = _settings.default("metrics_port")
    metrics_address: str = _settings.default("metrics_address")
    shutdown_timeout: float = _settings.default("shutdown_timeout")
    supervisor_fd: int = _settings.default("supervisor_fd")  # the control daemon's link (supervisor.py); not in argv()
    config: Path | None = None  # the operator's configuration file (config_file.py)

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
                          placement=not args.no_placement and _settings.value("placement"),
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


def _flag_type(setting: _settings.Setting):
    """The argparse type of a flag with a value: the setting's parser, its refusal argparse's message."""
    def parse(text: str):
        try:
            return setting.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = setting.name
    return parse


def flag_default(setting: _settings.Setting):
    """What the parser holds for ``setting`` when its flag is not given: False for a switch; None for a
    setting the environment or the configuration file may give (resolved later, in that order),
    else the table's default."""
    if setting.switch:
        return False
    return None if setting.env or setting.file_key else setting.fallback()


def _flag_help(setting: _settings.Setting) -> str:
    if setting.who == "internal":
        return argparse.SUPPRESS
    if setting.flag_help:
        return setting.flag_help
    fallback = setting.describe_default().replace("`", "")
    if setting.file_key:
        fallback = f"{setting.file_key} of --config, else {fallback}"
    if setting.env:
        fallback = f"{setting.env}, else {fallback}"
    return f"{setting.meaning.replace('`', '')} (default: {fallback})"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arbiter's options (shared by ``python -m libshare.arbiter`` and ``libshare-control``):
    one flag for each row of the settings table that has one, named, parsed, defaulted and explained
    by that row."""
    group = parser.add_argument_group("arbiter options")
    for setting in _settings.TABLE:
        if setting.flag is None:
            continue
        if setting.switch:
            group.add_argument(setting.flag, action="store_true", help=_flag_help(setting))
        else:
            group.add_argument(setting.flag, dest=setting.name, type=_flag_type(setting),
                               default=flag_default(setting), metavar=setting.metavar, help=_flag_help(setting))
