"""``python -m libshare.arbiter``: run an arbiter in the foreground until SIGINT, SIGTERM or ``quit``."""

from __future__ import annotations

import argparse
import sys

from libshare.arbiter import service as _daemon


def main(argv: list[str] | None = None) -> int:
    """Parse the arbiter's options and serve (see :func:`libshare.arbiter.service.run`)."""
    parser = argparse.ArgumentParser(prog="python -m libshare.arbiter",
                                     description="libshare arbiter in the foreground (libshare-control -f does the same)")
    _daemon.add_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="log only to server.log, not to stderr")
    parser.add_argument("--supervise", action="store_true",
                        help="run the control daemon, which starts the arbiter and a new one whenever it dies")
    args = parser.parse_args(argv)
    options = _daemon.Options.from_args(args)
    if args.supervise:
        from libshare.daemon import supervisor as _supervisor

        return _supervisor.run(options, echo=not args.quiet)
    return _daemon.run(options, echo=not args.quiet)


if __name__ == "__main__":
    sys.exit(main())
