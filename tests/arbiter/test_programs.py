"""Programs shared by content: one pipeline per distinct module across clients, counted by their users."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import libshare
from libshare.arbiter import Arbiter, _programs
from libshare.errors import InvalidSubmission

from .conftest import wait_until


@pytest.fixture
def arbiter(tmp_path, vulkan_device_name):
    """An in-process arbiter serving on ``tmp_path``; yields (arbiter, pipe directory)."""
    tmp_path.chmod(0o700)
    served = Arbiter()
    served.serve(tmp_path / "control")
    yield served, tmp_path
    served.close()


def saxpy_once(session, program) -> bool:
    x, y = session.array(64), session.array(64)
    x[:], y[:] = 2.0, 1.0
    session.dispatch(program, 1, [x, y], struct.pack("If", 64, 3.0)).wait(10)
    return bool(np.all(y == 7.0))


def test_clients_loading_one_module_share_one_pipeline(arbiter):
    served, pipe_dir = arbiter
    pipelines = served.drainer.pipelines
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as first, \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir) as second:
        mine = first.load_program(libshare.shaders.path("saxpy"))
        theirs = second.load_program(libshare.shaders.path("saxpy"))
        again = second.load_program(libshare.shaders.path("saxpy"))
        assert len(pipelines) == 1
        second.load_program(libshare.shaders.path("vadd"))
        assert len(pipelines) == 2
        first.free(mine)  # the other client's loads keep the pipeline alive
        assert saxpy_once(second, theirs) and saxpy_once(second, again)
        second.free(theirs)
        assert len(pipelines) == 2 and saxpy_once(second, again)
        second.free(again)
        assert first.load_program(libshare.shaders.path("busy")) is not None
        assert len(pipelines) == 2, "saxpy's pipeline outlived its last user"  # vadd and busy
    wait_until(lambda: len(pipelines) == 0, 10, "the last pipelines to go with their clients")


def test_reflections_are_remembered_by_content_and_bounded(monkeypatch):
    monkeypatch.setattr(_programs, "_INTERFACES", 2)
    interfaces = _programs.Interfaces()
    modules = [libshare.shaders.path(name).read_bytes() for name in ("saxpy", "vadd", "sum")]
    digest, saxpy = interfaces.of(modules[0])
    assert interfaces.of(bytes(modules[0])) == (digest, saxpy)  # same content, another object
    assert interfaces.of(modules[1])[1].bindings == (0, 1, 2)
    interfaces.of(modules[2])
    assert len(interfaces._known) == 2 and digest not in interfaces._known
    with pytest.raises(InvalidSubmission):
        interfaces.of(b"\x03\x02\x23\x07" + bytes(16))
