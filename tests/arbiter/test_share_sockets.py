"""Share sockets: a group's own socket holds whoever connects through it to the group (_share_sockets.py).

A container's environment is its own: one that dropped LIBSHARE_GROUP left its allocation's group
and its limits, and one running as root was the arbiter's operator. Through a share socket the
group, the default priority and "no control commands" hold whatever the client asks for."""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

import libshare
from libshare.protocol.control import ControlConnection
from libshare.arbiter.serve.share_sockets import MAX_SHARES, SHARES

from tests.arbiter.conftest import wait_until
from tests.arbiter import test_connection_attacks as attacks
from tests.arbiter.test_connection_attacks import NOBODY, as_uid, needs_root, start_arbiter
from tests.arbiter.test_reattach import Daemon

PUSH = struct.pack("If", 64, 1.0)
open_base = attacks.open_base  # the fixture: a directory every user may enter


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


def test_a_closed_share_keeps_its_clients_and_the_next_arbiter_starts_without_shares(tmp_path,
                                                                                   vulkan_device_name):
    """Share sockets belong to one arbiter, as group limits do: opened again from what a dead arbiter
    left, they came back before the limits (a review reconnected 0.4 s after a kill and allocated 16M
    past a 1M group limit), and a share whose group went to another container meanwhile stayed open."""
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
    with start_arbiter(pipe_dir):
        assert control(pipe_dir, "get_share_list") == ""
        with pytest.raises(libshare.ArbiterUnavailable):  # what the last one left answers nobody
            libshare.connect(mode="daemon", pipe_directory=kept, timeout=2)
        control(pipe_dir, "open_share", "kept")
        with libshare.connect(mode="daemon", pipe_directory=kept) as session:
            assert session.stats()["submitted"] == 0


def test_a_share_serves_a_quarter_of_the_client_slots_and_its_owner_rules_hold(tmp_path, vulkan_device_name):
    """One share took all 48 client slots in 0.03 s (the operator's own client was then refused)."""
    pipe_dir = tmp_path / "pipe"

    def admitted():
        try:
            return libshare.connect(mode="daemon", pipe_directory=share)
        except libshare.TooManyClients:
            return None

    with start_arbiter(pipe_dir, "--max-clients", "8"):
        share = Path(control(pipe_dir, "open_share", "busy"))
        with contextlib.ExitStack() as stack:
            for _ in range(2):
                stack.enter_context(libshare.connect(mode="daemon", pipe_directory=share))
            with pytest.raises(libshare.TooManyClients, match="share socket of group busy serves 2 clients"):
                libshare.connect(mode="daemon", pipe_directory=share)
            with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as operator_client:
                assert operator_client.stats()["submitted"] == 0
        with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as watcher:
            wait_until(lambda: watcher.stats()["clients"] == 1, 30, "the share's clients to leave")  # slots back
            start, sessions = threading.Barrier(12), []  # twelve hellos at once: two are admitted, not more

            def hello_at_once():
                start.wait()
                sessions.append(admitted())

            threads = [threading.Thread(target=hello_at_once) for _ in range(12)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert sum(s is not None for s in sessions) == 2 and len(sessions) == 12
            for session in sessions:
                if session is not None:
                    session.close()


@needs_root
def test_through_a_share_socket_the_group_owner_rules_still_hold(open_base):
    """In multi-user mode a share socket is reachable by every local user, not only by the container
    that mounts it: a reviewer as nobody joined a group owned by uid 1000 (3M of its 4M) and a group
    the operator had made realtime, both refused on the arbiter's own socket. Root came through
    them past both rules."""
    with start_arbiter(open_base / "pipe", "--multi-user") as (process, pipe_dir):
        owned, fast, free = (Path(control(pipe_dir, "open_share", g)) for g in ("owned", "fast", "free"))
        control(pipe_dir, "set_group_owner", "owned", "1000")
        control(pipe_dir, "set_group_priority", "fast", "realtime")

        def join(share):
            return as_uid(NOBODY, lambda: libshare.connect(mode="daemon", pipe_directory=share).close())

        assert join(owned).startswith("AccessDenied") and "belongs to uid 1000" in join(owned)
        assert join(fast).startswith("AccessDenied") and "priority realtime" in join(fast)
        assert join(free) == "None"
        for share, refusal in ((owned, "belongs to uid 1000"), (fast, "priority realtime")):
            with pytest.raises(libshare.AccessDenied, match=refusal):  # root (this process): a tenant there too
                libshare.connect(mode="daemon", pipe_directory=share).close()
        with libshare.connect(mode="daemon", pipe_directory=pipe_dir, group="owned") as operator_client:
            assert operator_client.stats()["submitted"] == 0  # admitted: through its own socket root is trusted
        control(pipe_dir, "set_group_owner", "mine", str(NOBODY))
        assert join(free).startswith("AccessDenied")  # it owns a group now: it cannot leave it this way
        assert process.poll() is None


def test_a_session_through_a_share_socket_survives_a_restart_and_a_kill(tmp_path, vulkan_device_name):
    """A contained session cannot see the control daemon's lock; the welcome says that a control daemon
    supervises, so it waits for the next arbiter and its share socket (opened again, after the
    group's limits, by the plugin), and reattaches through it, still in its group."""
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
                with pytest.raises(libshare.ArbiterUnavailable):  # no share until its limits are back
                    libshare.connect(mode="daemon", pipe_directory=share, timeout=1)
                daemon.run("set_group_mem_limit", "job", "1M")  # what the plugin does for a new arbiter
                assert daemon.run("open_share", "job") == str(share)
                session.dispatch(program, 1, [x, y], PUSH).wait(60)
                assert session.arbiter_pid == daemon.arbiter() and session.reattached == step + 1
                assert np.all(y == step + 1)
                with pytest.raises(libshare.QuotaExceeded):  # the session is in the group still
                    session.array(512 << 10, np.uint32)
    finally:
        daemon.stop()
