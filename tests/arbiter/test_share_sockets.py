"""Share sockets: a group's own socket holds whoever connects through it to the group (_share_sockets.py).

A container's environment is its own: one that dropped LIBSHARE_GROUP left its allocation's group
and its limits, and one running as root was the arbiter's operator. Through a share socket the
group, the default priority and "no control commands" hold whatever the client asks for."""

from __future__ import annotations

import os
import signal
import struct
from pathlib import Path

import numpy as np
import pytest

import libshare
from libshare._control import ControlConnection
from libshare.arbiter._share_sockets import MAX_SHARES, SHARES, SOCKET

from .conftest import wait_until
from .test_connection_attacks import start_arbiter
from .test_reattach import Daemon

PUSH = struct.pack("If", 64, 1.0)


def control(pipe_dir, *command: str) -> str:
    with ControlConnection(pipe_dir, timeout=30) as connection:
        return connection.run(*command)


def test_a_share_socket_holds_its_clients_to_its_group(daemon):
    _, pipe_dir = daemon
    share = pipe_dir / SHARES / "k8s-0123"
    assert control(pipe_dir, "set_group_mem_limit", "k8s-0123", "1M") == "1M"
    assert control(pipe_dir, "open_share", "k8s-0123") == str(share)
    assert control(pipe_dir, "get_share_list") == "k8s-0123"
    with libshare.connect(mode="daemon", pipe_directory=share, name="contained") as contained:
        with pytest.raises(libshare.QuotaExceeded):  # no group named: the share's group, and its limit
            contained.array(512 << 10, np.uint32)
        small = contained.array(64)
        small[:] = 1.0
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir, name="outside") as outside:
        outside.array(512 << 10, np.uint32)  # the same request through the arbiter's socket: no group, no limit
    with pytest.raises(libshare.AccessDenied, match="share of group k8s-0123"):
        libshare.connect(mode="daemon", pipe_directory=share, group="elsewhere")
    with pytest.raises(libshare.AccessDenied, match="priority realtime"):  # whatever the uid (root here)
        libshare.connect(mode="daemon", pipe_directory=share, priority="realtime")
    with pytest.raises(libshare.AccessDenied, match="takes sessions only"):
        control(share, "set_default_client_priority", "low")
    with pytest.raises(libshare.AccessDenied, match="takes sessions only"):
        control(share, "get_server_list")
    assert control(pipe_dir, "get_default_client_priority") == "normal"
    with libshare.connect(mode="daemon", pipe_directory=share, group="k8s-0123", priority="low") as named:
        assert named.priority == "low"  # its own group named, a lower priority asked: allowed


def test_share_names_are_directory_names_and_shares_are_bounded(daemon):
    _, pipe_dir = daemon
    for bad in ("../escape", "a/b", ".hidden", "-flag", "", "x" * 65, "tab\there", "ü"):
        with pytest.raises(libshare.InvalidSubmission, match="names a directory"):
            control(pipe_dir, "open_share", bad)
    assert not (pipe_dir.parent / "escape").exists() and not (pipe_dir / SHARES).exists()
    for i in range(MAX_SHARES):
        control(pipe_dir, "open_share", f"g{i}")
    with pytest.raises(libshare.InvalidSubmission, match=f"{MAX_SHARES} share sockets are open"):
        control(pipe_dir, "open_share", "one-more")
    assert control(pipe_dir, "open_share", "g7") == str(pipe_dir / SHARES / "g7")  # open already: as it was
    assert control(pipe_dir, "close_share", "g7") == "closed"
    assert control(pipe_dir, "close_share", "g7") == "not open"
    assert control(pipe_dir, "open_share", "one-more") == str(pipe_dir / SHARES / "one-more")
    assert len(control(pipe_dir, "get_share_list").split()) == MAX_SHARES
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir / SHARES / "g200") as session:
        assert session.stats()["submitted"] == 0  # the 200th still answers


def test_a_closed_share_keeps_its_clients_and_the_next_arbiter_opens_the_open_ones_again(tmp_path,
                                                                                         vulkan_device_name):
    pipe_dir = tmp_path / "pipe"
    kept, closed = pipe_dir / SHARES / "kept", pipe_dir / SHARES / "closed"
    with start_arbiter(pipe_dir):
        control(pipe_dir, "open_share", "kept")
        control(pipe_dir, "open_share", "closed")
        with libshare.connect(mode="daemon", pipe_directory=closed, name="stays") as session:
            assert control(pipe_dir, "close_share", "closed") == "closed"
            assert not closed.exists()
            x, y = session.array(64), session.array(64)
            x[:], y[:] = 1.0, 2.0
            program = session.load_program(libshare.shaders.path("saxpy"))
            session.dispatch(program, 1, [x, y], PUSH).wait(30)
            assert np.all(y == 3.0)
        with pytest.raises(libshare.ArbiterUnavailable):
            libshare.connect(mode="daemon", pipe_directory=closed, timeout=2)
    assert (kept / SOCKET).exists()  # left for the next arbiter
    with start_arbiter(pipe_dir):
        assert control(pipe_dir, "get_share_list") == "kept"
        with libshare.connect(mode="daemon", pipe_directory=kept) as session:
            assert session.stats()["submitted"] == 0
        assert not closed.exists()


def test_a_session_through_a_share_socket_survives_a_restart_and_a_kill(tmp_path, vulkan_device_name):
    """The next arbiter opens the share again (a hand-over leaves the old one's socket file, and so
    does a SIGKILL), and the session reattaches through it, still in its group."""
    daemon = Daemon(tmp_path / "pipe")
    try:
        share = Path(daemon.run("open_share", "job"))
        with libshare.connect(mode="daemon", pipe_directory=share, timeout=60) as session:
            program = session.load_program(libshare.shaders.path("saxpy"))
            x, y = session.array(64), session.array(64)
            x[:], y[:] = 1.0, 0.0
            for step, end_arbiter in enumerate((lambda: daemon.run("restart"),
                                                lambda: os.kill(daemon.arbiter(), signal.SIGKILL))):
                old = daemon.arbiter()
                end_arbiter()
                wait_until(lambda: daemon.arbiter() not in (old, None), 120, "the new arbiter")
                session.dispatch(program, 1, [x, y], PUSH).wait(60)
                assert session.arbiter_pid == daemon.arbiter() and session.reattached == step + 1
                assert np.all(y == step + 1)
                assert daemon.run("get_share_list") == "job"
                daemon.run("set_group_mem_limit", "job", "1M")  # limits are set again (the plugin does)
                with pytest.raises(libshare.QuotaExceeded):  # the session is in the group still
                    session.array(512 << 10, np.uint32)
                daemon.run("set_group_mem_limit", "job", "unlimited")
    finally:
        daemon.stop()
