"""``libshare-control``: start the arbiter (``-d`` detached, ``-f`` in the foreground) and steer it.

Modelled on ``nvidia-cuda-mps-control``: a command comes as arguments
(``libshare-control ps -p 123``) or one per line on standard input
(``echo ps | libshare-control``). Each command issued and its result are appended,
with a timestamp, to control.log in the log directory.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import textwrap
import time
from typing import Iterable

from libshare.protocol import paths as _config
from libshare.protocol.control import COMMANDS, ControlConnection
from libshare.daemon.directory import serving_pid
from libshare.daemon.logs import log_handler
from libshare.daemon.options import Options, add_arguments
from libshare.daemon.start import start_background
from libshare.errors import ArbiterLost, ArbiterUnavailable, LibshareError

__all__ = ["main"]

log = logging.getLogger("libshare.control")

_RESULT_CHARS = 2000  # control.log keeps at most this much of one command's output


def _commands_help() -> str:
    lines = ["commands (as arguments, or one per line on standard input):"]
    for command in COMMANDS.values():
        lines.append(f"  {command.usage}")
        lines.extend(textwrap.wrap(command.help, 88, initial_indent="      ", subsequent_indent="      "))
    lines.append("")
    lines.append("examples: libshare-control -d; libshare-control ps; echo get_server_status | libshare-control;")
    lines.append("          libshare-control quit -t 30")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="libshare-control", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Start the libshare arbiter or send it control commands.",
        epilog=_commands_help())
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("-d", "--daemon", action="store_true",
                      help="start the arbiter in the background; return once it is ACTIVE")
    mode.add_argument("-f", "--foreground", action="store_true",
                      help="run the arbiter in the foreground (logs also on stderr) until SIGINT, SIGTERM or quit")
    parser.add_argument("--start-timeout", type=float, default=60.0,
                        help="seconds -d waits for the arbiter to become ACTIVE (default 60)")
    add_arguments(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="a command and its arguments (see below)")
    return parser


def _error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)


def _unknown(name: str) -> str:
    return f"unknown command {name!r}; valid commands: {', '.join(COMMANDS)}"


def _open_control_log(options: Options) -> None:
    """Append this process's command log to control.log; a log directory we cannot write only warns."""
    if log.handlers:
        return
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        options.log_directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        log.addHandler(log_handler(options.log_directory / "control.log"))
    except OSError as exc:
        print(f"warning: not logging to {options.log_directory / 'control.log'}: {exc}", file=sys.stderr)
        log.addHandler(logging.NullHandler())


def _close_control_log() -> None:
    for handler in list(log.handlers):
        log.removeHandler(handler)
        handler.close()


def _summary(output: str) -> str:
    text = output.strip().replace("\n", " | ")
    return text if len(text) <= _RESULT_CHARS else text[:_RESULT_CHARS] + "..."


class _Runner:
    """Sends commands over one control connection, opened on first use; counts failures."""

    def __init__(self, options: Options):
        self.options = options
        self.failures = 0
        self._connection: ControlConnection | None = None

    def command(self, words: list[str]) -> None:
        """Run one command, print its output (or ``error: ...``), and log both."""
        line = shlex.join(words)
        try:
            if words[0] not in COMMANDS:
                raise ValueError(_unknown(words[0]))
            output = self._connection_open().run(words[0], *words[1:])
        except (LibshareError, ValueError) as exc:
            self.failures += 1
            if isinstance(exc, (ArbiterLost, ArbiterUnavailable)):
                self.close()
            message = str(exc)
            if isinstance(exc, ArbiterUnavailable):
                message += " (start one with: libshare-control -d)"
            _error(message)
            log.warning("%s -> error: %s", line, message)
            return
        if output:
            print(output if output.endswith("\n") else output + "\n", end="", flush=True)
        log.info("%s -> %s", line, _summary(output) or "ok")

    def line(self, line: str) -> None:
        """Run the command on one line of standard input (blank lines and # comments do nothing)."""
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            self.failures += 1
            _error(f"cannot parse {line.strip()!r}: {exc}")
            return
        if words:
            self.command(words)

    def _connection_open(self) -> ControlConnection:
        if self._connection is None:
            self._connection = ControlConnection(self.options.pipe_directory)
        return self._connection

    def close(self) -> None:
        """Close the connection, if one is open."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _stdin_lines() -> Iterable[str]:
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("libshare-control> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        yield line


def _run_commands(options: Options, command: list[str]) -> int:
    _open_control_log(options)
    runner = _Runner(options)
    try:
        if command:
            runner.command(command)
        for line in [] if command else _stdin_lines():
            runner.line(line)
    finally:
        runner.close()
        _close_control_log()
    return 1 if runner.failures else 0


def _start_daemon(options: Options, timeout: float) -> int:
    started = time.monotonic()
    _open_control_log(options)
    try:
        process = start_background(options, timeout, supervised=True)
    except (LibshareError, OSError) as exc:
        _error(str(exc))
        log.error("-d: the arbiter did not start: %s", exc)
        return 1
    finally:
        _close_control_log()
    print(f"libshare arbiter pid {serving_pid(options.pipe_directory)} ACTIVE at "
          f"{_config.socket_path(options.pipe_directory)} under control daemon pid {process.pid} "
          f"({time.monotonic() - started:.2f} s)", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``libshare-control``; returns the exit status (non-zero if anything failed)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        options = Options.from_args(args)
    except ValueError as exc:  # a bad LIBSHARE_* setting, named in the message
        parser.error(str(exc))
    if (args.daemon or args.foreground) and args.command:
        _error(f"-d and -f take no command (got {shlex.join(args.command)!r}); run commands separately")
        return 2
    if args.daemon:
        return _start_daemon(options, args.start_timeout)
    if args.foreground:
        from libshare.daemon import supervisor as _supervisor

        return _supervisor.run(options, echo=True)
    return _run_commands(options, args.command)


if __name__ == "__main__":
    sys.exit(main())
