"""Quarantine: a client process, its tenant or a module that brought arbiters down is refused, and
nobody else: a tenant cannot frame a kernel for the others, nor evade by forking or by changing
a word of its module.

Each test runs real arbiters one after another on one pipe directory, as a supervisor would:
what a dead arbiter journaled (quarantine.py) becomes a strike in the next one. A share socket
(open_share) stands for another tenant: the test runs as one uid. A compile is
killed by SIGKILLing the arbiter while its journal record is there; a runaway dispatch makes
the arbiter give its device up and exit on its own (lavapipe never aborts one).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import libshare
from libshare.protocol import control as _control
from libshare.daemon.options import EXIT_UNRECOVERABLE
from libshare._proc import start_time
from libshare.workloads import busy_reference
from libshare.arbiter.drain.quarantine import Quarantine
from libshare.arbiter.drain.strikes import COOLDOWN
from libshare.arbiter.programs.identity import canonical_digest, canonical_words

from tests.conftest import ROOT, stop_process
from tests.arbiter._spirv_attacks import compile_glsl, have_tools
from tests.arbiter.conftest import start_client, wait_until
from tests.arbiter.test_compiler import saxpy_round_trip


def control(pipe_dir, command: str, *args: str) -> str:
    return _control.run(command, *args, pipe_directory=pipe_dir)


@contextlib.contextmanager
def arbiter(pipe_dir, *args: str, **env):
    """A daemon arbiter on ``pipe_dir`` with extra options and environment; yields its process once it
    listens, and stops it (if it still runs) afterwards."""
    stderr_path = pipe_dir.parent / f"{pipe_dir.name}.stderr"  # a file: a full pipe would stall the arbiter
    with open(stderr_path, "a") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "libshare.arbiter", "--pipe-directory", str(pipe_dir),
                                    *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr,
                                   env={**os.environ, **env})
    try:
        wait_until(lambda: serves(pipe_dir, process) or process.poll() is not None, 60, "the arbiter to listen")
        assert process.poll() is None, f"arbiter did not start: {stderr_path.read_text()[-2000:]}"
        yield process
    finally:
        stop_process(process)


def serves(pipe_dir, process) -> bool:
    """Whether ``process`` answers on the pipe directory's socket (a dead one's may still be there)."""
    try:
        return control(pipe_dir, "get_server_list") == str(process.pid)
    except libshare.LibshareError:
        return False


def journal(pipe_dir) -> list:
    """The arbiter's journal records (actions under way)."""
    directory = pipe_dir / "quarantine"
    return sorted(directory.glob("action-*")) if directory.exists() else []


def slow_compile(directory) -> bytes:
    """A valid kernel whose pipeline takes lavapipe seconds to create (NIR unrolls 262,144 steps, which
    then fold to one constant: its dispatch is quick, so the vetting child is done in about the same
    time). New code each run, though the pipeline is compiled afresh anyway (no cache holds it)."""
    salt = os.getpid() ^ int.from_bytes(os.urandom(3), "little")
    return compile_glsl(f"""#version 450
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X {{ uint x[]; }};
void main() {{
    uint acc = {salt}u;
    [[unroll]] for (int j = 0; j < 512; j++) {{
        [[unroll]] for (int k = 0; k < 512; k++) {{
            acc = acc * 1664525u + uint(j * 512 + k);
        }}
    }}
    x[gl_GlobalInvocationID.x] = acc;
}}
""", directory, "slow_create")


def one_word_changed(module: bytes, n: int) -> bytes:
    """``module`` with one word the validator ignores changed: a letter of its first OpName (a debug
    name) and the header's generator word; what it computes is the same."""
    words = list(struct.unpack(f"<{len(module) // 4}I", module))
    words[2] = (words[2] & 0xFFFF0000) | (n & 0xFFFF)  # the generator's version
    pos = 5
    while words[pos] & 0xFFFF != 5:  # OpName
        pos += words[pos] >> 16
    words[pos + 2] = (words[pos + 2] & ~0xFF) | (ord("a") + n % 26)  # the name's first letter
    return struct.pack(f"<{len(words)}I", *words)


def open_share(pipe_dir, group: str):
    """Open ``group``'s share socket (a tenant of its own whatever its uid); its pipe directory."""
    return Path(control(pipe_dir, "open_share", group))


def busy_round_trip(session) -> bool:
    """A short dispatch of busy.comp through the arbiter, checked against numpy."""
    program = session.load_program(libshare.shaders.path("busy"))
    data = session.array(4096, np.uint32)
    session.dispatch(program, 64, [data], struct.pack("II", 4096, 100)).wait(60)
    return bool(np.array_equal(data, busy_reference(4096, 100)))


def kill_during_compile(pipe_dir, loader_dir, path, process) -> dict:
    """Have a new loader process (through ``loader_dir``) load ``path``, and SIGKILL the arbiter while
    it compiles the module (the "driver crash"); the journal record it left."""
    loader = start_client("load", loader_dir, path)
    assert loader.stdout.readline().strip() == "connected"
    record = wait_until(lambda: journal(pipe_dir), 240, "the arbiter compiling the module")[0]
    process.kill()
    process.wait()
    assert loader.stdout.readline().strip() not in ("loaded", "")  # the error of a lost arbiter
    assert loader.wait(timeout=60) == 0
    loader.stdout.close()
    written = json.loads(record.read_text())
    assert (written["action"], written["client"]["pid"]) == ("compile", loader.pid)
    return written


def test_a_module_whose_compile_killed_arbiters_of_two_tenants_is_refused_to_everyone(tmp_path, vulkan_device_name):
    """Two tenants (the uid through the arbiter's socket, then a share socket) each crash the arbiter
    compiling the same kernel, each with one debug word changed: one identity, refused to everyone."""
    if have_tools():
        pytest.skip(have_tools())
    module = slow_compile(tmp_path)
    identity = canonical_digest(module).hex()
    variants = [tmp_path / f"variant{n}.spv" for n in range(3)]
    for n, path in enumerate(variants):
        path.write_bytes(one_word_changed(module, n))
    assert len({hashlib.sha256(p.read_bytes()).digest() for p in variants}) == 3
    pipe_dir = tmp_path / "pipe"
    for attempt in (0, 1):
        with arbiter(pipe_dir, LIBSHARE_COMPILE_TIMEOUT="300") as process:
            door = pipe_dir if attempt == 0 else open_share(pipe_dir, "tenant-b")
            assert kill_during_compile(pipe_dir, door, variants[attempt], process)["program"] == identity
    with arbiter(pipe_dir, LIBSHARE_COMPILE_TIMEOUT="300") as process, \
            libshare.connect(name="honest", mode="daemon", pipe_directory=open_share(pipe_dir, "c")) as honest:
        assert not journal(pipe_dir)  # counted, then cleared
        log = (pipe_dir / "server.log").read_text()
        assert f"strike 1 of 2 by share:tenant-b for program {identity}" in log
        assert "it is refused to everyone from now on" in log
        with pytest.raises(libshare.Quarantined, match=f"refuses this program \\(identity {identity}, SHA-256 "
                                                       f"[0-9a-f]{{64}}\\) to every client") as refused:
            honest.load_program(variants[2])  # a third variant, by a third tenant
        assert "clear_quarantine" in str(refused.value)
        assert saxpy_round_trip(honest)  # the other clients keep working
        assert f"QUARANTINED program {identity}: 2 strikes, refused to everyone" in control(pipe_dir, "ps")
        assert f"program {identity}: 2 strikes, refused to everyone; compile by client pid" in \
            control(pipe_dir, "get_quarantine")
        assert control(pipe_dir, "clear_quarantine", identity[:16]) == \
            f"cleared program {identity} (2 strikes, refused to everyone)"
        assert honest.load_program(variants[2]) is not None  # lifted: vetted and compiled again, and it survives
        assert saxpy_round_trip(honest)
        assert process.poll() is None


def test_a_tenant_that_runs_a_kernel_past_the_watchdog_cannot_quarantine_it_for_others(tmp_path, vulkan_device_name):
    """Framing: one process runs the shipped busy.spv with its own inputs past a short watchdog and
    ends two arbiters. The process and busy.spv for its uid are refused (the operator's uid gets no
    cooldown); another tenant loads busy.spv and gets its results right."""
    pipe_dir = tmp_path / "pipe"
    options = ("--shutdown-timeout", "2")  # how long the runaway may run after the fault, in each arbiter
    runaway = None
    tenant = f"uid:{os.getuid()}"
    try:
        for attempt in (1, 2):
            with arbiter(pipe_dir, *options, LIBSHARE_WATCHDOG_SECONDS="1") as process:
                if runaway is None:  # one process for every round: it outlives each arbiter and reconnects
                    runaway = start_client("runaway_rounds", pipe_dir, 3)
                assert runaway.stdout.readline().strip() == f"connected {attempt}"
                if attempt == 2:
                    assert f"strike 1 of 2 for client pid {runaway.pid} (runaway" in (pipe_dir / "server.log").read_text()
                assert runaway.stdout.readline().split()[:2] == ["lost", str(attempt)]
                assert process.wait(timeout=120) == EXIT_UNRECOVERABLE
                assert [json.loads(r.read_text())["action"] for r in journal(pipe_dir)] == \
                    ["dispatch past the watchdog"]
        busy = canonical_digest(libshare.shaders.path("busy").read_bytes()).hex()
        with arbiter(pipe_dir, *options, LIBSHARE_WATCHDOG_SECONDS="1") as process:
            refusal = runaway.stdout.readline()
            assert refusal.startswith(f"refused Quarantined: the arbiter refuses this process (pid {runaway.pid}): "
                                      "it brought the arbiter down 2 times (dispatch past the watchdog of program ")
            assert f"clear_quarantine {runaway.pid}" in refusal
            assert runaway.wait(timeout=60) == 0
            runaway.stdout.close()
            with libshare.connect(mode="daemon", pipe_directory=pipe_dir):  # the operator's uid: no cooldown
                pass
            with libshare.connect(name="other", mode="daemon", pipe_directory=open_share(pipe_dir, "other")) as other:
                assert busy_round_trip(other)  # the kernel is not refused to another tenant, and runs right
                assert saxpy_round_trip(other)
            ps = control(pipe_dir, "ps")
            assert f"QUARANTINED client pid {runaway.pid}: 2 strikes, refused; name runaway" in ps
            assert f"QUARANTINED {tenant}" not in ps  # (it owns the service)
            assert f"QUARANTINED program {busy}: 2 strikes, refused to {tenant}" in ps
            with libshare.connect(name="same-uid", mode="daemon", pipe_directory=pipe_dir) as same:
                with pytest.raises(libshare.Quarantined, match=f"{busy}.* to the clients of {tenant}"):
                    same.load_program(libshare.shaders.path("busy"))  # still refused to the uid that ran it long
                assert saxpy_round_trip(same)
            log = (pipe_dir / "server.log").read_text()
            assert f"strike 2 of 2 for client pid {runaway.pid} (runaway" in log
            assert "it is refused to everyone" not in log
            assert f"refused pid {runaway.pid} (runaway, uid {os.getuid()}): quarantined after 2 strikes" in log
            assert process.poll() is None
    finally:
        if runaway is not None and runaway.poll() is None:
            runaway.kill()
            runaway.wait()
            runaway.stdout.close()


LOAD_AND_STAY = """
import sys, libshare
session = libshare.connect(name="attacker", mode="daemon", pipe_directory=sys.argv[1], reattach=False)
session.load_program(sys.argv[2])
print("loaded", flush=True)
sys.stdin.readline()
"""


def test_new_processes_of_one_tenant_with_one_word_changed_modules_are_refused_by_it(tmp_path, vulkan_device_name):
    """Evasion: each round a new process of one tenant (a share socket: a fork cannot shed it) loads
    saxpy with one debug word changed and crashes the arbiter while its descriptor is processed (the
    test hook). After two, the tenant's next process is refused, whatever its module; a client of
    another tenant is served throughout."""
    pipe_dir = tmp_path / "pipe"
    saxpy = libshare.shaders.path("saxpy").read_bytes()
    for crash in range(2):
        with arbiter(pipe_dir, LIBSHARE_TEST_HOOKS="1") as process, \
                libshare.connect(name="honest", mode="daemon", pipe_directory=open_share(pipe_dir, "honest"),
                                 reattach=False) as honest:
            assert saxpy_round_trip(honest)
            variant = tmp_path / f"saxpy{crash}.spv"
            variant.write_bytes(one_word_changed(saxpy, crash))
            attacker = subprocess.Popen([sys.executable, "-c", LOAD_AND_STAY, str(open_share(pipe_dir, "attacker")),
                                         str(variant)], cwd=ROOT,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # a new process
            try:
                assert attacker.stdout.readline().strip() == "loaded"
                with contextlib.suppress(libshare.LibshareError):  # it may answer before the signal lands
                    control(pipe_dir, "inject_crash", str(attacker.pid))
                assert process.wait(timeout=60) == -11
            finally:
                stop_process(attacker)
                attacker.stdin.close()
                attacker.stdout.close()
            assert json.loads(journal(pipe_dir)[0].read_text())["client"]["pid"] == attacker.pid
    with arbiter(pipe_dir) as process:
        fresh = start_client("load", open_share(pipe_dir, "attacker"), tmp_path / "saxpy1.spv")  # a third process
        refusal = fresh.stdout.readline()
        assert refusal.startswith("refused Quarantined: the arbiter refuses every new client of share:attacker")
        assert fresh.wait(timeout=60) == 0
        fresh.stdout.close()
        with libshare.connect(name="honest", mode="daemon", pipe_directory=open_share(pipe_dir, "honest")) as honest:
            assert saxpy_round_trip(honest)
        assert "share:attacker: 2 strikes, refused for" in control(pipe_dir, "get_quarantine")
        assert control(pipe_dir, "clear_quarantine", "share:attacker") == "cleared share:attacker (2 strikes, refused)"
        with start_client_checked(open_share(pipe_dir, "attacker")) as served:  # lifted
            assert served == "ok"
        assert process.poll() is None


def test_modules_that_differ_only_in_debug_words_and_id_numbering_have_one_identity(tmp_path):
    busy = libshare.shaders.path("busy").read_bytes()
    renumbered = tmp_path / "renumbered.spv"  # every id moved: the text's %N numbers shuffled, reassembled
    text = subprocess.run(["spirv-dis", "--raw-id", "-"], input=busy, capture_output=True, check=True).stdout.decode()
    ids = sorted({int(n) for n in re.findall(r"%(\d+)", text)})
    moved = dict(zip(ids, random.Random(7).sample(ids, len(ids))))
    source = tmp_path / "renumbered.spvasm"
    source.write_text(re.sub(r"%(\d+)", lambda m: f"%{moved[int(m.group(1))] + 100}", text))
    subprocess.run(["spirv-as", "--target-env", "spv1.3", str(source), "-o", str(renumbered)], check=True)
    renumbered = renumbered.read_bytes()
    assert renumbered != busy
    same = [busy, one_word_changed(busy, 3), renumbered]
    assert len({canonical_digest(m) for m in same}) == 1
    assert canonical_digest(libshare.shaders.path("saxpy").read_bytes()) != canonical_digest(busy)
    # without spirv-opt: the debug words and the header still do not count (the numbering does)
    assert canonical_words(one_word_changed(busy, 3)) == canonical_words(busy)
    assert canonical_words(renumbered) != canonical_words(busy)


def test_a_tenant_refused_again_is_refused_twice_as_long(tmp_path):
    """The rate limit per tenant, from records of dead arbiters: a uid and a share socket are tenants
    of their own; two strikes within the window start a cooldown, doubled after the last one."""
    quarantine_dir = tmp_path / "quarantine"
    quarantine_dir.mkdir()
    me = {"pid": os.getpid(), "uid": 4321, "start": start_time(os.getpid()), "name": "t", "cmdline": "t"}

    def record(serial: int, share=None) -> None:
        (quarantine_dir / f"action-1-{serial}").write_text(json.dumps(
            {"arbiter": 1, "arbiter_start": 0, "action": "compile", "since": 1e9 + serial, "program": None,
             "share": share, "client": me}))  # arbiter pid 1 with another start time: a dead arbiter

    def opened() -> Quarantine:
        quarantine = Quarantine()
        quarantine.open(tmp_path)
        return quarantine

    record(1)
    record(2, "g")
    quarantine = opened()  # one dead arbiter: one strike for the uid, one for the share
    quarantine.check_client(1, 4321)
    quarantine.check_client(1, 4321, "g")
    record(3)
    quarantine = opened()
    with pytest.raises(libshare.Quarantined, match=f"every new client of uid:4321 for {COOLDOWN:.0f} s"):
        quarantine.check_client(1, 4321)
    quarantine.check_client(1, 4322)  # another uid
    quarantine.check_client(1, 4321, "g")  # the uid's client through a share socket: that share's tenant
    store = json.loads((quarantine_dir / "strikes.json").read_text())
    [tenant] = [t for t in store["tenants"] if t["tenant"] == "uid:4321"]
    assert (tenant["refusals"], tenant["cooldown"], tenant["recent"]) == (1, COOLDOWN, [])
    tenant["until"] = 0  # the cooldown is over
    (quarantine_dir / "strikes.json").write_text(json.dumps(store))
    quarantine = opened()
    quarantine.check_client(1, 4321)
    record(4)
    record(5, "g")
    opened()
    record(6)
    quarantine = opened()
    with pytest.raises(libshare.Quarantined, match=f"uid:4321 for {2 * COOLDOWN:.0f} s"):
        quarantine.check_client(1, 4321)
    with pytest.raises(libshare.Quarantined, match="every new client of share:g"):
        quarantine.check_client(1, 4321, "g")


def test_a_garbled_quarantine_does_not_stop_the_arbiter(tmp_path, vulkan_device_name):
    pipe_dir = tmp_path / "pipe"
    quarantine = pipe_dir / "quarantine"
    quarantine.mkdir(parents=True)
    (quarantine / "action-1-1").write_bytes(b"\xff" * 100)
    (quarantine / "action-1-2").write_text("[" * 4000)  # deeper than the JSON parser goes
    (quarantine / "action-1-3").write_bytes(b" " * 100_000)  # past a record's bound
    (quarantine / "action-1-4").write_text(json.dumps({"arbiter": 1, "action": "compile", "since": 0,
                                                       "program": "../../etc", "client": {"pid": -1}}))
    os.mkfifo(quarantine / "action-1-5")  # opened without blocking, and not read
    os.symlink("/etc/passwd", quarantine / "action-1-6")  # not followed
    me = {"pid": os.getpid(), "uid": os.getuid(), "start": start_time(os.getpid()), "name": "tests",
          "cmdline": "pytest"}
    live = quarantine / "action-2-1"  # of a live arbiter (this process stands for one handing over): it stays
    live.write_text(json.dumps({"arbiter": os.getpid(), "arbiter_start": start_time(os.getpid()),
                                "action": "compile", "since": 1.0, "program": None, "client": me}))
    for store in (b"[" * 200_000, b"x" * (2 << 20)):  # too deep; too large
        (quarantine / "strikes.json").write_bytes(store)
        with arbiter(pipe_dir), libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
            assert saxpy_round_trip(session)
            assert control(pipe_dir, "get_quarantine") == ""
    assert journal(pipe_dir) == [live]
    log = (pipe_dir / "server.log").read_text()
    assert log.count("quarantine: ignoring journal record") == 6
    assert log.count("starting with no strikes") == 2
    assert "quarantine: strike" not in log
    live.unlink()
    # A well-formed store whose entries are partly garbage: the good one counts (here: this very
    # process, struck twice), the rest is dropped.
    me = {**me, "strikes": 2, "reasons": ["compile of program 0123 (a test's say-so)"], "last": 1.0}
    junk = [{"pid": "1"}, [], None, {**me, "strikes": True}, {**me, "last": float("nan")}]
    (quarantine / "strikes.json").write_text(json.dumps({"version": 1, "clients": [me, *junk],
                                                         "programs": [{"digest": "zz"}, 7]}))
    with arbiter(pipe_dir):
        with pytest.raises(libshare.Quarantined, match=f"pid {os.getpid()}.*a test's say-so"):
            libshare.connect(mode="daemon", pipe_directory=pipe_dir)
        assert control(pipe_dir, "clear_quarantine", str(os.getpid())) == \
            f"cleared client pid {os.getpid()} (2 strikes, refused)"
        with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:
            assert saxpy_round_trip(session)
    assert "dropped 7 malformed entries" in (pipe_dir / "server.log").read_text()
    assert json.loads((quarantine / "strikes.json").read_text())["clients"] == []  # the clearing is durable


def test_a_process_whose_descriptor_crashed_two_arbiters_is_refused(tmp_path, vulkan_device_name):
    """A crash (SIGSEGV, as a driver would) while the engine handles a client's descriptor: the crash
    handler turns the record the arbiter prepared for that client into a journal record, and the next
    arbiter counts it. The test hook crashes the arbiter the way the engine would be caught."""
    pipe_dir = tmp_path / "pipe"
    for crash in range(2):
        with arbiter(pipe_dir, LIBSHARE_TEST_HOOKS="1") as process:
            with libshare.connect(mode="daemon", pipe_directory=pipe_dir, reattach=False) as session:
                saxpy_round_trip(session)
                written = {p.name for p in (pipe_dir / "quarantine").iterdir()} - {"strikes.json"}
                assert not written  # the client's record is held in memory, not written ahead
                with contextlib.suppress(libshare.LibshareError):  # it may answer before the signal lands
                    control(pipe_dir, "inject_crash", str(os.getpid()))
                assert process.wait(timeout=60) == -11  # SIGSEGV: the handler re-raised it
                records = journal(pipe_dir)
                assert [p.name.rsplit("-", 1)[0] for p in records] == [f"action-{process.pid}"]
                assert records[0].name.rsplit("-", 1)[1].startswith("crash")
                assert json.loads(records[0].read_bytes())["client"]["pid"] == os.getpid()
    with arbiter(pipe_dir) as process:
        with pytest.raises(libshare.Quarantined, match="descriptor being processed"):
            libshare.connect(mode="daemon", pipe_directory=pipe_dir)
        assert not journal(pipe_dir)  # the dead arbiters' records were counted and removed
        with start_client_checked(open_share(pipe_dir, "other")) as honest:  # another tenant is served
            assert honest == "ok"
        log = (pipe_dir / "server.log").read_text()
        assert "strike 2 of 2" in log and "descriptor being processed" in log


@contextlib.contextmanager
def start_client_checked(pipe_dir):
    client = start_client("mixed", pipe_dir, 1, 3)
    try:
        yield client.communicate(timeout=120)[0].strip()
    finally:
        stop_process(client)


CRASH_WITH_RECORD = """
import os, signal, sys
from libshare.arbiter.drain import emergency as _emergency
directory, slot, busy, record = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].encode()
_emergency.install(directory + "/../no-socket", directory + "/../no-lock")
_emergency.journal(directory)
_emergency.prepare(slot, b"a record of an earlier client of this slot, longer than the next one")
_emergency.prepare(slot, record)
_emergency.set_busy(busy)
print(os.getpid(), flush=True)
os.kill(os.getpid(), signal.SIGSEGV)
"""


def crash_with_record(directory, slot: int, busy: int, record: str) -> int:
    """A process that hands ``record`` to the crash handler for ``slot``, sets the busy word to ``busy``
    and dies of SIGSEGV; its pid."""
    process = subprocess.run([sys.executable, "-c", CRASH_WITH_RECORD, str(directory), str(slot), str(busy), record],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert process.returncode == -11, process.stderr[-2000:]  # the handler re-raised the signal
    return int(process.stdout)


@pytest.mark.parametrize("slot", [0, 7, 65535])
def test_the_crash_handler_writes_the_busy_clients_record_whole(tmp_path, slot):
    record = json.dumps({"slot": slot, "name": "\u00e9" * 100})
    pid = crash_with_record(tmp_path, slot, slot + 1, record)
    assert [p.name for p in tmp_path.iterdir()] == [f"action-{pid}-crash{slot}"]
    assert (tmp_path / f"action-{pid}-crash{slot}").read_text() == record  # the later, shorter one, whole


@pytest.mark.parametrize("busy", [0, 4], ids=["nobody busy", "another slot busy"])
def test_the_crash_handler_writes_nothing_for_a_client_it_was_not_handling(tmp_path, busy):
    crash_with_record(tmp_path, 2, busy, "{}")
    assert list(tmp_path.iterdir()) == []


def test_a_withdrawn_record_is_not_written(tmp_path):
    crash_with_record(tmp_path, 2, 3, "")  # prepare(slot, b"") withdraws the earlier record
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("slot, record, error", [(65536, b"{}", "out of range"), (1 << 32, b"{}", "does not fit"),
                                                 (-1, b"{}", "negative"), (0, b"x" * 4097, "too long")])
def test_a_record_the_handler_cannot_hold_is_refused(slot, record, error):
    from libshare.arbiter.drain import emergency as _emergency

    with pytest.raises((OSError, OverflowError), match=error):
        _emergency.prepare(slot, record)


def test_a_record_of_a_name_and_command_line_that_escape_long_fits_the_handler(tmp_path):
    from libshare.arbiter.drain.quarantine import DESCRIPTOR, Quarantine
    from libshare.arbiter.drain import emergency as _emergency

    class Client:
        pid, uid, slot = os.getpid(), os.getuid(), 5
        name = cmdline = "\U0001F600" * 400  # 12 bytes each once escaped

    quarantine = Quarantine()
    quarantine.open(tmp_path)
    record = quarantine._record_of(DESCRIPTOR, Client, None)
    assert len(record) <= _emergency.RECORD_BYTES
    assert json.loads(record)["client"]["pid"] == os.getpid()
