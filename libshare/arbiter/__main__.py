"""``python -m libshare.arbiter``: run an arbiter in the foreground until SIGINT, SIGTERM or ``quit``."""

from __future__ import annotations

import argparse
import sys

from libshare.daemon.options import Options, add_arguments


def main(argv: list[str] | None = None) -> int:
    """Parse the arbiter's options and serve (:func:`libshare.arbiter.service.run`), or run the control daemon."""
    parser = argparse.ArgumentParser(prog="python -m libshare.arbiter",
                                     description="libshare arbiter in the foreground (libshare-control -f does the same)")
    add_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="log only to server.log, not to stderr")
    parser.add_argument("--supervise", action="store_true",
                        help="run the control daemon, which starts the arbiter and a new one whenever it dies")
    args = parser.parse_args(argv)
    try:
        options = Options.from_args(args)
    except ValueError as exc:  # a bad LIBSHARE_* setting, named in the message
        parser.error(str(exc))
    if args.supervise:
        from libshare.daemon import supervisor  # the control daemon: nothing of the engine or Vulkan

        return supervisor.run(options, echo=not args.quiet)
    from libshare.arbiter import service  # the arbiter itself

    return service.run(options, echo=not args.quiet)


if __name__ == "__main__":
    sys.exit(main())
