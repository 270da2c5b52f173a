"""A client process for the daemon tests: ``python -m tests.control._client PIPE_DIR``.

It keeps short dispatches going until the arbiter goes away, then prints how the
session ended: ``lost`` for a clean ArbiterLost, else the exception's class name.
"""

from __future__ import annotations

import struct
import sys

import numpy as np

import libshare


def main(pipe_dir: str) -> None:
    """Dispatch and wait in a loop; print 'ready' once one round trip worked, then how it ended."""
    with libshare.connect(name="looper", mode="daemon", pipe_directory=pipe_dir) as session:
        program = session.load_program(libshare.shaders.path("saxpy"))
        x, y = session.array(1024, np.float32), session.array(1024, np.float32)
        push = struct.pack("If", 1024, 2.0)
        session.dispatch(program, groups=4, buffers=[x, y], push=push).wait(timeout=30)
        print("ready", flush=True)
        try:
            while True:
                session.dispatch(program, groups=4, buffers=[x, y], push=push).wait(timeout=30)
        except libshare.ArbiterLost:
            print("lost", flush=True)
        except Exception as exc:  # reported to the test, which fails on anything but ArbiterLost
            print(type(exc).__name__, exc, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
