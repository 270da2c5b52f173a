"""``python -m libshare.arbiter``: run an arbiter in the foreground until SIGINT, SIGTERM or ``quit``."""

from __future__ import annotations

import argparse
import sys

from . import _daemon


def main(argv: list[str] | None = None) -> int:
    """Parse the arbiter's options and serve (see :func:`libshare.arbiter._daemon.run`)."""
    parser = argparse.ArgumentParser(prog="python -m libshare.arbiter",
                                     description="libshare arbiter in the foreground (libshare-control -f does the same)")
    _daemon.add_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="log only to server.log, not to stderr")
    args = parser.parse_args(argv)
    return _daemon.run(_daemon.Options.from_args(args), echo=not args.quiet)


if __name__ == "__main__":
    sys.exit(main())
