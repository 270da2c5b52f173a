"""One process, no set-up: saxpy through libshare (an arbiter is embedded when no daemon runs)."""

import struct

import numpy as np

import libshare

n = 1 << 20
with libshare.connect(name="single") as session:
    saxpy = session.load_program(libshare.shaders.path("saxpy"))
    x = session.array(n, np.float32)  # zero-copy: the device reads this memory directly
    y = session.array(n, np.float32)
    x[:] = np.arange(n, dtype=np.float32)
    y[:] = 1.0
    ticket = session.dispatch(saxpy, groups=n // 64, buffers=[x, y], push=struct.pack("If", n, 2.0))
    ticket.wait(timeout=30)
    assert np.array_equal(y, 2.0 * np.arange(n, dtype=np.float32) + 1.0)
    print(f"saxpy on {n} floats via {session.device_name}: right, {ticket.device_ns / 1e6:.2f} ms on the device")
