"""Device memory limits (default, server, client, environment, group) against a live daemon."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading

import pytest

import libshare
from libshare.protocol import control as _control
from libshare.arbiter.policy.limits import format_size, parse_limit, parse_size
from libshare.errors import InvalidSubmission, ProtocolError, QuotaExceeded

from tests.conftest import ROOT
from tests.arbiter.conftest import run_daemon, wait_until

M = 1 << 20


def control(pipe_dir, command: str, *args: str) -> str:
    return _control.run(command, *args, pipe_directory=pipe_dir)


class Allocator:
    """A client process (the ``allocator`` role) that allocates when told to."""

    def __init__(self, pipe_dir, name: str, group: str = "", **env: str):
        environ = {k: v for k, v in os.environ.items() if k not in ("LIBSHARE_DEVICE_MEM_LIMIT", "LIBSHARE_GROUP")}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.arbiter._client", "allocator", str(pipe_dir), name, group],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**environ, **env})
        assert self.process.stdout.readline().strip() == "ready"
        self.pid = self.process.pid

    def tell(self, line: str) -> str:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def alloc(self, nbytes: int) -> str:
        return self.tell(f"alloc {nbytes}")

    def close(self) -> None:
        self.process.communicate(timeout=60)


@pytest.fixture
def allocators():
    """Start allocator clients with ``allocators(pipe_dir, name, group, **env)``; all end with the test."""
    started: list[Allocator] = []

    def start(*args, **env) -> Allocator:
        started.append(Allocator(*args, **env))
        return started[-1]

    yield start
    for allocator in started:
        allocator.process.kill()
        allocator.process.communicate()


def ps_rows(pipe_dir) -> dict[str, list[str]]:
    """ps by client name: the whitespace-separated cells of each row."""
    header, *rows = control(pipe_dir, "ps").splitlines()
    assert header.split()[8:10] == ["MEMORY", "MEM_LIMIT"]
    return {row.split()[2]: row.split() for row in rows}


# -------------------------------------------------------------------- values


@pytest.mark.parametrize("text, value", [("4096", 4096), ("900M", 900 * M), ("2G", 2 << 30), ("2g", 2 << 30),
                                         ("512KiB", 512 << 10), ("1.5G", 3 << 29), ("16MB", 16 * M)])
def test_sizes_parse_in_binary_units(text, value):
    assert parse_size(text) == value
    assert parse_size(format_size(value)) == value


def test_unlimited_reads_as_none():
    assert parse_limit("unlimited") is None and parse_limit("none") is None
    assert format_size(None) == "unlimited" and format_size(12345) == "12345" and format_size(3 * M) == "3M"


@pytest.mark.parametrize("text, message", [("12X", "not a memory size: '12X'"), ("-1G", "cannot be negative"),
                                           ("", "not a memory size"), ("G", "not a memory size")])
def test_bad_sizes_are_refused_clearly(text, message):
    with pytest.raises(InvalidSubmission, match=message):
        parse_size(text)


# -------------------------------------------------------------------- commands


def test_commands_set_and_get_each_level(daemon):
    process, pipe_dir = daemon
    uuid = control(pipe_dir, "get_device_client_list").split()[1]
    server = str(process.pid)
    assert control(pipe_dir, "get_default_device_pinned_mem_limit", "0") == "unlimited"
    assert control(pipe_dir, "set_default_device_pinned_mem_limit", "0", "900M") == "900M"
    assert control(pipe_dir, "get_default_device_pinned_mem_limit", uuid) == "900M"  # the device by UUID
    assert control(pipe_dir, "get_device_pinned_mem_limit", server, "0") == "900M"  # the server inherits it
    assert control(pipe_dir, "set_device_pinned_mem_limit", server, uuid, "2G") == "2G"
    assert control(pipe_dir, "get_device_pinned_mem_limit", server, "0") == "2G"
    assert control(pipe_dir, "get_default_device_pinned_mem_limit", "0") == "900M"
    assert control(pipe_dir, "set_device_pinned_mem_limit", server, "0", "unlimited") == "unlimited"
    assert control(pipe_dir, "get_device_pinned_mem_limit", server, "0") == "900M"
    assert control(pipe_dir, "get_group_mem_limit", "job-42") == "unlimited"
    assert control(pipe_dir, "set_group_mem_limit", "job-42", str(3 * M)) == "3M"
    assert control(pipe_dir, "get_group_mem_limit", "job-42") == "3M"
    assert control(pipe_dir, "set_group_mem_limit", "job-42", "none") == "unlimited"
    assert control(pipe_dir, "get_group_mem_limit", "job-42") == "unlimited"


def test_bad_values_get_clear_errors(daemon):
    process, pipe_dir = daemon
    server = str(process.pid)
    with pytest.raises(InvalidSubmission, match="not a memory size: '12X'"):
        control(pipe_dir, "set_default_device_pinned_mem_limit", "0", "12X")
    with pytest.raises(InvalidSubmission, match="cannot be negative: '-1G'"):
        control(pipe_dir, "set_device_pinned_mem_limit", server, "0", "-1G")
    with pytest.raises(InvalidSubmission, match="no device '3' here: this arbiter serves device 0"):
        control(pipe_dir, "set_default_device_pinned_mem_limit", "3", "1G")
    with pytest.raises(InvalidSubmission, match="no device 'GPU-0000' here"):
        control(pipe_dir, "get_device_pinned_mem_limit", server, "GPU-0000")
    with pytest.raises(InvalidSubmission, match="no client with pid 1 "):
        control(pipe_dir, "set_device_pinned_mem_limit", "1", "0", "1G")
    with pytest.raises(InvalidSubmission, match="usage: set_group_mem_limit GROUP VALUE"):
        control(pipe_dir, "set_group_mem_limit", "job-42")
    with pytest.raises(InvalidSubmission, match="group name"):
        control(pipe_dir, "set_group_mem_limit", "g" * 65, "1G")
    with pytest.raises(ProtocolError, match="unknown command"):
        control(pipe_dir, "set_group_mem_limits", "job-42", "1G")
    assert control(pipe_dir, "get_default_device_pinned_mem_limit", "0") == "unlimited"  # nothing was set
    assert control(pipe_dir, "get_device_pinned_mem_limit", server, "0") == "unlimited"


def test_bad_client_environment_is_refused_at_connect(daemon, monkeypatch):
    _, pipe_dir = daemon
    monkeypatch.setenv("LIBSHARE_DEVICE_MEM_LIMIT", "12X")
    with pytest.raises(InvalidSubmission, match="LIBSHARE_DEVICE_MEM_LIMIT='12X': not a memory size: '12X'"):
        libshare.connect(mode="daemon", pipe_directory=pipe_dir)


def test_a_bad_limit_in_the_arbiters_environment_stops_it_clearly(tmp_path, vulkan_device_name):
    result = subprocess.run([sys.executable, "-m", "libshare.arbiter", "--pipe-directory", str(tmp_path / "pipe")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "LIBSHARE_DEVICE_MEM_LIMIT": "0=-1G"})
    assert "did not start: LIBSHARE_DEVICE_MEM_LIMIT='0=-1G': a memory size cannot be negative" in result.stderr
    assert not (tmp_path / "pipe" / "control").exists()


def test_the_arbiters_environment_sets_the_default(tmp_path, vulkan_device_name, allocators):
    for process, pipe_dir in run_daemon(tmp_path / "pipe", LIBSHARE_DEVICE_MEM_LIMIT="0=8M"):  # the MPS form
        assert control(pipe_dir, "get_default_device_pinned_mem_limit", "0") == "8M"
        client = allocators(pipe_dir, "env-default")
        assert client.alloc(6 * M) == "ok"
        refused = client.alloc(4 * M)
        assert refused.startswith("QuotaExceeded") and "the default limit of 8M" in refused
        assert "uses 6M now" in refused


# -------------------------------------------------------------------- the hierarchy


def test_each_level_binds_and_the_lowest_wins(daemon, allocators):
    process, pipe_dir = daemon
    server = str(process.pid)
    plain = allocators(pipe_dir, "plain")
    modest = allocators(pipe_dir, "modest", LIBSHARE_DEVICE_MEM_LIMIT="2M")
    assert ps_rows(pipe_dir)["plain"][9] == "unlimited" and ps_rows(pipe_dir)["modest"][9] == "2M"

    control(pipe_dir, "set_default_device_pinned_mem_limit", "0", "4M")  # default
    refused = plain.alloc(6 * M)
    assert refused.startswith("QuotaExceeded") and "the default limit of 4M" in refused
    assert control(pipe_dir, "get_device_pinned_mem_limit", str(plain.pid), "0") == "4M (default)"

    control(pipe_dir, "set_device_pinned_mem_limit", server, "0", "8M")  # server: overrides the default (MPS)
    assert plain.alloc(6 * M) == "ok"
    refused = plain.alloc(4 * M)
    assert "the server limit of 8M" in refused and "uses 6M now" in refused

    refused = modest.alloc(3 * M)  # its own environment is lower than the server's
    assert "the client limit of 2M (the client's LIBSHARE_DEVICE_MEM_LIMIT)" in refused
    assert control(pipe_dir, "get_device_pinned_mem_limit", str(modest.pid), "0") == "2M (client)"

    control(pipe_dir, "set_device_pinned_mem_limit", str(plain.pid), "0", "16M")  # client: overrides the server
    assert plain.alloc(4 * M) == "ok"
    control(pipe_dir, "set_device_pinned_mem_limit", str(modest.pid), "0", "16M")
    assert "the client limit of 2M" in modest.alloc(3 * M)  # the environment still only lowers it
    rows = ps_rows(pipe_dir)
    assert rows["plain"][8:10] == ["10.0MiB", "16M"] and rows["modest"][8:10] == ["0B", "2M"]

    control(pipe_dir, "set_group_mem_limit", "nobody", "1M")  # a group they are not in binds nothing
    assert plain.alloc(M) == "ok"


def test_a_higher_limit_in_the_client_environment_changes_nothing(daemon, allocators):
    process, pipe_dir = daemon
    control(pipe_dir, "set_device_pinned_mem_limit", str(process.pid), "0", "4M")
    greedy = allocators(pipe_dir, "greedy", LIBSHARE_DEVICE_MEM_LIMIT="1G")  # asks for more than the server's
    unset = allocators(pipe_dir, "unset")  # or deletes the variable
    for client in (greedy, unset):
        refused = client.alloc(6 * M)
        assert refused.startswith("QuotaExceeded") and "the server limit of 4M" in refused
        assert client.alloc(4 * M) == "ok"
        assert client.alloc(4096).startswith("QuotaExceeded")
    assert control(pipe_dir, "get_device_pinned_mem_limit", str(greedy.pid), "0") == "4M (server)"
    assert ps_rows(pipe_dir)["greedy"][8:10] == ["4.0MiB", "4M"]


def buffer_memfds(pid: int) -> int:
    """How many of process ``pid``'s descriptors are buffer memfds (``memfd:libshare-buffer``)."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:libshare-buffer")
    return count


def test_a_refused_allocation_leaves_nothing_behind(daemon):
    process, pipe_dir = daemon
    control(pipe_dir, "set_device_pinned_mem_limit", str(process.pid), "0", "1M")
    with libshare.connect(name="tidy", mode="daemon", pipe_directory=pipe_dir) as session:
        kept = session.array(1 << 17, "uint8")  # 128 KiB
        kept[:] = 7
        memfds, memory = buffer_memfds(process.pid), ps_rows(pipe_dir)["tidy"][8]
        for kind in ("shared", "device"):
            with pytest.raises(QuotaExceeded, match=r"past the server limit of 1M .*: it uses 128K now"):
                session.alloc(M, kind)
            # no buffer memfd left open in the arbiter (counting every descriptor raced with the spare
            # ring the arbiter makes for its next client, and with the ps connection above)
            wait_until(lambda: buffer_memfds(process.pid) <= memfds, 10, "the arbiter to close the refused memfd")
        assert ps_rows(pipe_dir)["tidy"][8] == memory == "128.0KiB"
        assert session.stats()["memory_bytes"] == 1 << 17
        extra = session.alloc(M - (1 << 17))  # exactly up to the limit is allowed
        assert session.stats()["memory_bytes"] == M and (kept == 7).all()
        session.free(extra)


# -------------------------------------------------------------------- live changes and groups


def test_a_running_clients_limit_changes_live(daemon, allocators):
    _, pipe_dir = daemon
    client = allocators(pipe_dir, "live")
    assert client.alloc(4 * M) == "ok"
    assert control(pipe_dir, "set_device_pinned_mem_limit", str(client.pid), "0", "2M") == "2M"
    refused = client.alloc(4096)  # below what it holds: nothing is freed, nothing more is given
    assert "the client limit of 2M (set_device_pinned_mem_limit CLIENT_PID)" in refused and "uses 4M" in refused
    assert ps_rows(pipe_dir)["live"][8:10] == ["4.0MiB", "2M"]
    assert client.tell("free") == "ok"
    assert client.alloc(2 * M) == "ok"
    control(pipe_dir, "set_device_pinned_mem_limit", str(client.pid), "0", "16M")
    assert client.alloc(8 * M) == "ok"


def test_a_group_limit_caps_its_members_together(daemon, allocators):
    _, pipe_dir = daemon
    control(pipe_dir, "set_group_mem_limit", "job-42", "10M")
    members = [allocators(pipe_dir, f"member{i}", "job-42") for i in range(2)]
    members.append(allocators(pipe_dir, "member2", LIBSHARE_GROUP="job-42"))  # joined by the environment
    outsider = allocators(pipe_dir, "outsider")
    for member in members:
        assert member.alloc(3 * M) == "ok"
    refused = members[0].alloc(3 * M)  # 9M held: the fourth 3M would pass 10M
    assert refused.startswith("QuotaExceeded") and "group 'job-42' past the group limit of 10M" in refused
    assert "its clients use 9M now" in refused
    assert outsider.alloc(3 * M) == "ok"
    assert members[2].alloc(M) == "ok"  # up to exactly the limit
    assert members[1].tell("free") == "ok"
    assert members[0].alloc(3 * M) == "ok"
    control(pipe_dir, "set_group_mem_limit", "job-42", "4M")  # lowered below its use: refuses, frees nothing
    assert "the group limit of 4M" in members[1].alloc(4096)
    assert [ps_rows(pipe_dir)[f"member{i}"][8] for i in range(3)] == ["6.0MiB", "0B", "4.0MiB"]


def test_concurrent_allocations_cannot_both_pass_the_limit(daemon):
    _, pipe_dir = daemon
    control(pipe_dir, "set_group_mem_limit", "race", "8M")
    sessions = [libshare.connect(name=f"racer{i}", group="race", mode="daemon", pipe_directory=pipe_dir)
                for i in range(6)]
    start, outcomes = threading.Barrier(len(sessions)), []

    def race(session):
        start.wait()
        try:
            session.alloc(3 * M)
            outcomes.append("ok")
        except QuotaExceeded:
            outcomes.append("refused")

    threads = [threading.Thread(target=race, args=(s,)) for s in sessions]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(outcomes) == ["ok"] * 2 + ["refused"] * 4  # 3M + 3M fit in 8M, a third would not
        assert sum(s.stats()["memory_bytes"] for s in sessions) == 6 * M
    finally:
        for session in sessions:
            session.close()


def test_an_embedded_arbiter_takes_its_default_from_the_environment(vulkan_device_name):
    script = ("import libshare\n"
              "with libshare.connect(mode='embedded') as s:\n"
              "    s.alloc(3 << 20)\n"
              "    try:\n"
              "        s.alloc(2 << 20)\n"
              "    except libshare.QuotaExceeded as exc:\n"
              "        print(exc)\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "LIBSHARE_DEVICE_MEM_LIMIT": "4M"})
    assert "past the default limit of 4M" in result.stdout and "it uses 3M now" in result.stdout, result.stderr


def test_a_client_holds_at_most_its_buffer_count_and_the_others_are_untouched(tmp_path):
    """Each buffer costs the arbiter a memory map (vm.max_map_count): one client held 64,977 of 4 KiB
    and new clients could not connect. LIBSHARE_MAX_BUFFERS (8 here) bounds what one client holds."""
    for process, pipe_dir in run_daemon(tmp_path / "pipe", LIBSHARE_MAX_BUFFERS="8"):
        with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as hoarder, \
                libshare.connect(mode="daemon", pipe_directory=pipe_dir) as other:
            held = [hoarder.array(16) for _ in range(8)]
            with pytest.raises(QuotaExceeded, match="holds 8 buffers, the most one client may"):
                hoarder.array(16)
            with pytest.raises(QuotaExceeded, match="holds 8 buffers"):
                hoarder.alloc(4096, kind="device")
            assert len([other.array(16) for _ in range(8)]) == 8  # the limit is per client
            hoarder.free(held.pop())
            held.append(hoarder.array(16))  # room again
            assert hoarder.stats()["memory_bytes"] == 8 * 4096


def test_all_clients_together_hold_at_most_the_buffer_ceiling(monkeypatch):
    """Past the ceiling that vm.max_map_count leaves (cut here to what is held now plus 6), every
    client's next buffer is refused with a reason, and a freed one makes room."""
    from libshare.client.connect import _embedded

    arbiter = _embedded()
    with libshare.connect(mode="embedded") as first, libshare.connect(mode="embedded") as second:
        held_now = sum(len(c.buffers) for c in arbiter.drainer.clients.values())
        monkeypatch.setattr(arbiter.limits, "buffer_ceiling", held_now + 6)
        arrays = [first.array(16) for _ in range(3)] + [second.array(16) for _ in range(3)]
        for session in (first, second):
            with pytest.raises(QuotaExceeded, match=f"hold {held_now + 6} buffers together.*vm.max_map_count"):
                session.array(16)
        first.free(arrays[0])
        second.array(16)


def test_the_buffer_ceiling_keeps_maps_for_every_client_slot():
    from libshare.arbiter.policy.limits import buffer_ceiling

    with open("/proc/sys/vm/max_map_count") as f:
        most = int(f.read())
    none, many = buffer_ceiling(0), buffer_ceiling(1000)
    assert 0 < none < most // 2
    assert abs((none - many) - 2000) < 50  # 4 maps per slot, 2 per buffer (the process's own maps may move)


def test_a_client_that_allocates_and_frees_for_ever_keeps_a_small_object_table():
    """The engine finds a client's buffers and programs in a hash table. A freed entry left a
    tombstone that counted as taken, and every rebuild doubled the table, so it grew by a slot per
    alloc and free for as long as the client stayed connected: 4,096 slots after 3,000 cycles."""
    from libshare.client.connect import _embedded

    arbiter = _embedded()
    before = set(arbiter.drainer.clients)
    with libshare.connect(mode="embedded") as session:
        kept = [session.array(16) for _ in range(10)]  # its requests wait for it to be added to the engine
        (client,) = [c for key, c in list(arbiter.drainer.clients.items()) if key not in before and not c.closing]
        for _ in range(3000):
            session.free(session.array(16))
        slots = arbiter.drainer.engine.stats(client.slot).table_slots
        assert session.stats()["memory_bytes"] == len(kept) * 4096
    assert 16 <= slots <= 64, f"{slots} slots for 10 live buffers after 3,000 alloc/free cycles"
