"""``python -m libshare.arbiter``: run an arbiter in the foreground until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading

from .. import _config
from ._server import Arbiter


def main(argv: list[str] | None = None) -> None:
    """Create the pipe directory (0700), listen on its socket, serve until a signal."""
    parser = argparse.ArgumentParser(description="libshare arbiter (foreground)")
    parser.add_argument("--pipe-directory", default=None, help="default: LIBSHARE_PIPE_DIRECTORY")
    parser.add_argument("--device", default=None, help="index or UUID (default: LIBSHARE_DEVICE, else 0)")
    parser.add_argument("--max-clients", type=int, default=48)
    parser.add_argument("--no-timestamps", action="store_true",
                        help="skip per-dispatch device timing (saves ~40 us a submission on lavapipe)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    directory = _config.pipe_directory(args.pipe_directory)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    path = _config.socket_path(directory)
    path.unlink(missing_ok=True)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    arbiter = Arbiter(args.device, max_clients=args.max_clients, timed=not args.no_timestamps)
    arbiter.serve(path)
    print(f"libshare arbiter pid {os.getpid()} serving {arbiter.device.name} at {path}", flush=True)
    stop.wait()
    arbiter.close()


if __name__ == "__main__":
    main()
