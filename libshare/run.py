"""``libshare-run``: run an unmodified Vulkan program as a libshare client, through libshare's driver.

``libshare-run [--name N] [--group G] [--priority P] [--mode auto|daemon|embedded] -- COMMAND...``
runs COMMAND with the Vulkan loader pointed at libshare's driver alone (``VK_DRIVER_FILES``, and
``VK_ICD_FILENAMES`` for loaders before 1.3.207, both naming its manifest): the program sees one
physical device, the arbiter's, named ``libshare: NAME`` (libshare/icd/, docs/icd.md). The
session's options travel in the environment variables that ``libshare.connect()`` and the driver
read (libshare/settings.py): ``--name`` is LIBSHARE_CLIENT_NAME (default: the command's file
name), ``--group`` LIBSHARE_GROUP, ``--priority`` LIBSHARE_CLIENT_PRIORITY; limits that may only
lower (LIBSHARE_DEVICE_MEM_LIMIT, LIBSHARE_ACTIVE_THREAD_PERCENTAGE) pass through as they are
set. Each is checked here first, as the arbiter would check it.

Modes, as ``connect()``'s (``--mode``, else LIBSHARE_MODE): ``daemon`` runs the program against
the arbiter of the pipe directory (LIBSHARE_PIPE_DIRECTORY), in place of this process (exec);
``embedded`` starts a helper arbiter of its own, on a private pipe directory, for the program's
lifetime, and stops it when the program ends: the way to embed one in a process that is not
Python, where the driver must not start an interpreter. The helper runs in a session of its own (a
terminal's ^C goes to the program alone); the signals that end a process (:data:`FORWARDED`)
are passed on to the program, and the helper is stopped once the program has ended. ``auto`` (the default) is ``daemon``
when an arbiter answers, else ``embedded``. The helper is started with the environment
libshare-run was given, so that it opens the real device, not libshare's driver.

``libshare-run --manifest`` prints the manifest's path, for those who set the variables
themselves (a container image, a systemd unit).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from libshare import settings as _settings
from libshare.errors import ArbiterUnavailable, LibshareError
from libshare.icd import manifest_path
from libshare.protocol import paths as _paths
from libshare.protocol import wire as protocol

__all__ = ["main", "driver_environment"]

DRIVER_VARIABLES = ("VK_DRIVER_FILES", "VK_ICD_FILENAMES")
"""The loader's variables that name the only drivers it loads (the second for loaders before 1.3.207)."""
HELPER_START = 60.0
"""Seconds an embedded helper arbiter may take to listen."""
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
"""Signals libshare-run passes on to the program in embedded mode (and then stops the helper when the
program ends); the terminal's SIGINT reaches the program itself."""
_POLL = 0.01


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="libshare-run", description="Run a Vulkan program as a libshare client, through libshare's "
        "Vulkan driver: it sees one device, the arbiter's, and its limits, priority and group apply.",
        epilog="example: libshare-run --group batch --priority low -- python3 train.py")
    parser.add_argument("--manifest", action="store_true", help="print the driver's manifest's path and exit")
    parser.add_argument("--name", help="the name `libshare-control ps` shows (default: the command's)")
    parser.add_argument("--group", help="the group the program joins (LIBSHARE_GROUP)")
    parser.add_argument("--priority", help="the priority it asks for (LIBSHARE_CLIENT_PRIORITY)")
    parser.add_argument("--mode", choices=_paths.MODES,
                        help="daemon: the pipe directory's arbiter; embedded: a helper arbiter for the program's "
                        "lifetime; auto (default, or LIBSHARE_MODE): daemon if one answers, else embedded")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    return parser


def driver_environment(env: dict[str, str], manifest: Path, name: str | None = None, group: str | None = None,
                       priority: str | None = None) -> dict[str, str]:
    """``env`` with the loader pointed at ``manifest`` alone and the session's options set (each checked
    as the settings table checks it; ValueError names a bad one)."""
    out = {**env, **{variable: str(manifest) for variable in DRIVER_VARIABLES}}
    for setting, value, flag in (("client_name", name, "--name"), ("group", group, "--group"),
                                 ("client_priority", priority, "--priority")):
        if value is not None:
            _settings.SETTINGS[setting].check(value, flag)
            out[_settings.SETTINGS[setting].env] = value
    return out


def _arbiter_answers(directory: Path) -> bool:
    """True when an arbiter listens in ``directory``."""
    sock = protocol.dial(_paths.socket_path(directory), timeout=5.0)
    if sock is None:
        return False
    sock.close()
    return True


def _start_helper(env: dict[str, str], directory: Path) -> subprocess.Popen:
    """An arbiter on ``directory``, listening; ArbiterUnavailable, with its last words, when it does not start."""
    log = directory / "helper.stderr"  # a file: a full pipe would stall it
    with open(log, "w") as stderr:
        helper = subprocess.Popen([sys.executable, "-m", "libshare.arbiter", "--pipe-directory", str(directory)],
                                  env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                  start_new_session=True)  # the terminal's ^C is the program's, not the helper's
    deadline = time.monotonic() + HELPER_START
    while not _paths.socket_path(directory).exists():
        if helper.poll() is not None or time.monotonic() > deadline:
            _stop(helper)
            raise ArbiterUnavailable(f"the helper arbiter did not start: {log.read_text()[-2000:]}")
        time.sleep(_POLL)
    return helper


def _stop(helper: subprocess.Popen) -> None:
    """Stop the helper arbiter (SIGTERM: it closes its device; SIGKILL if it does not within 30 s)."""
    if helper.poll() is None:
        helper.send_signal(signal.SIGTERM)
        try:
            helper.wait(30)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait()


def _run_embedded(command: list[str], env: dict[str, str], own_env: dict[str, str]) -> int:
    """Run ``command`` (in ``env``) beside a helper arbiter of its own (in ``own_env``); its exit status."""
    directory = Path(tempfile.mkdtemp(prefix="libshare-run-"))
    try:
        helper = _start_helper(own_env, directory)
        try:
            env = {**env, _settings.SETTINGS["pipe_directory"].env: str(directory),
                   _settings.SETTINGS["mode"].env: "daemon"}
            program = subprocess.Popen(command, env=env)
            forward = lambda signum, _frame: program.send_signal(signum)  # noqa: E731
            for signum in FORWARDED:
                signal.signal(signum, forward)
            while True:
                try:
                    status = program.wait()
                    break
                except KeyboardInterrupt:  # the terminal's SIGINT reached the program too: wait for it
                    continue
            return status if status >= 0 else 128 - status
        finally:
            _stop(helper)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``libshare-run``; returns the exit status (the program's, when it ran)."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        manifest = manifest_path()
    except LibshareError as exc:
        print(f"libshare-run: {exc}", file=sys.stderr)
        return 1
    if args.manifest:
        print(manifest)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run (libshare-run [OPTIONS] -- COMMAND [ARGS...])")
    own_env = {k: v for k, v in os.environ.items() if k not in DRIVER_VARIABLES}
    try:
        mode = _paths.connect_mode(args.mode)
        directory = _paths.pipe_directory()
        env = driver_environment(own_env, manifest, args.name or Path(command[0]).name, args.group, args.priority)
    except ValueError as exc:
        parser.error(str(exc))
    if mode == "auto":
        mode = "daemon" if _arbiter_answers(directory) else "embedded"
    if mode == "embedded":
        try:
            return _run_embedded(command, env, own_env)
        except (LibshareError, OSError) as exc:
            print(f"libshare-run: {exc}", file=sys.stderr)
            return 1
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"libshare-run: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
