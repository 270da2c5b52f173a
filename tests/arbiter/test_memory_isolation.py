"""Memory isolation: each attack of issue 11's Memory section, performed against a real daemon.

Every test has an honest client whose results are checked, and fails when its defence is
removed: leftover data (fresh device buffers read as zeros), shrinking a shared memfd
(sealed), no memory limit by default (the total limit, oom_score_adj), and same-uid snooping
through /proc/<arbiter>/fd (a non-dumpable daemon).

Run as ``python -m tests.arbiter.test_memory_isolation ROLE PIPE_DIR`` it is one of the
client processes of these tests (see :func:`shrinker` and :func:`secret_holder`).
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import libshare
from libshare import workloads
from libshare.client.buffers import Buffer
from libshare.arbiter.policy.limits import parse_size
from libshare.errors import QuotaExceeded

from tests.conftest import ROOT, stop_process
from tests.arbiter.conftest import run_daemon, start_client, wait_until
from tests.arbiter.test_limits import Allocator

K, M = 1 << 10, 1 << 20
NOBODY = 65534


def honest_client(pipe_dir, seed: int = 3, rounds: int = 40) -> subprocess.Popen:
    """A client process that runs every workload ``rounds`` times, checked against numpy."""
    return start_client("mixed", pipe_dir, seed, rounds)


def finished_right(process: subprocess.Popen) -> None:
    """Assert that an honest client saw every one of its results right."""
    output = process.communicate(timeout=300)[0]
    assert (process.returncode, output.strip()) == (0, "ok")


def run_busy(session, program, buffer, n: int, iterations: int):
    """Queue busy.comp over the first ``n`` words of ``buffer``; return its ticket."""
    return session.dispatch(program, -(-n // 64), [buffer], struct.pack("II", n, iterations))


# -------------------------------------------------------------------- leftover data


def test_fresh_buffers_read_as_zeros_not_another_clients_data(daemon):
    _, pipe_dir = daemon
    sizes = [4 * K, 8 * K, 16 * K, 32 * K, 64 * K, 128 * K, 192 * K, 256 * K] * 3
    with libshare.connect(name="owner", mode="daemon", pipe_directory=pipe_dir) as owner:
        pattern, back = owner.alloc(256 * K), owner.alloc(256 * K)
        pattern.array(64 * K, np.uint32)[:] = 0xA5A5A5A5
        owned = [owner.alloc(size, "device") for size in sizes]
        for buffer in owned:
            owner.copy(pattern, buffer, buffer.size)
        for buffer in owned:  # the owner's data really is there
            owner.copy(buffer, back, buffer.size).wait(30)
            assert (back.array(buffer.size // 4, np.uint32) == 0xA5A5A5A5).all()
        for buffer in owned:
            owner.free(buffer)

        with libshare.connect(name="snoop", mode="daemon", pipe_directory=pipe_dir) as snoop:
            out = snoop.alloc(256 * K)
            for size in sizes:
                fresh = snoop.alloc(size, "device")
                view = out.array(size // 4, np.uint32)
                view[:] = 7  # overwritten by the copy
                snoop.copy(fresh, out, size).wait(30)
                assert not view.any(), f"a fresh {size // K} KiB device buffer held {np.count_nonzero(view)} " \
                                       "non-zero words"
                assert not snoop.alloc(size).array(size, np.uint8).any()  # shared buffers too


# -------------------------------------------------------------------- shrinking shared memory


def hostile_alloc(session, size: int) -> tuple[Buffer, int]:
    """A shared buffer, and the memfd a hostile client keeps (the library closes its own)."""
    reply = session._request("alloc", size=size, kind="shared", max_fds=1)
    fd = reply.fds[0]
    return Buffer(session, reply.fields["buffer_id"], reply.fields["size"], "shared", os.dup(fd)), fd


def refused(fd: int, size: int) -> None:
    """Assert that ``ftruncate(fd, size)`` fails with EPERM."""
    try:
        os.ftruncate(fd, size)
    except PermissionError:
        return
    raise AssertionError(f"ftruncate to {size} bytes succeeded")


def shrinker(pipe_dir: str) -> None:
    """Client role: try to resize its ring and a buffer before and during dispatches on it;
    prints 'ok' when every attempt failed and the dispatches were right. A process of its
    own, since a shrunk ring would kill it too (SIGBUS)."""
    n, iterations = 1 << 14, 200
    expected = workloads.busy_reference(n, iterations)
    with libshare.connect(name="shrinker", mode="daemon", pipe_directory=pipe_dir) as session:
        ring = session._gate.attached.region.fd
        refused(ring, 0)  # no dispatch yet: the arbiter reads the ring all the same
        program = session.load_program(libshare.shaders.path("busy"))
        buffer, fd = hostile_alloc(session, 4 * n)
        for size in (0, 4096, 8 * n):  # shrinking, and growing
            refused(fd, size)
        run_busy(session, program, buffer, n, iterations).wait(60)
        assert (buffer.array(n, np.uint32) == expected).all()

        buffer.array(n, np.uint32)[:] = 0
        tickets = [run_busy(session, program, buffer, n, iterations) for _ in range(3)]
        for target in (fd, ring):  # while those are queued or running
            refused(target, 0)
        for ticket in tickets:
            ticket.wait(60)
        assert (buffer.array(n, np.uint32) == expected).all()
        assert os.fstat(fd).st_size == 4 * n and os.fstat(ring).st_size == session._gate.attached.region.size
    print("ok", flush=True)


def test_shared_memfds_cannot_be_resized_before_or_during_a_dispatch(daemon):
    arbiter, pipe_dir = daemon
    honest = honest_client(pipe_dir)
    attacker = subprocess.Popen([sys.executable, "-m", "tests.arbiter.test_memory_isolation", "shrinker",
                                 str(pipe_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    finished_right(attacker)
    finished_right(honest)
    assert arbiter.poll() is None


# -------------------------------------------------------------------- the total memory limit


def total_limit_in(message: str) -> int:
    """The bytes of the total limit that a QuotaExceeded message names."""
    match = re.search(r"the total limit of (\S+) \(", message)
    assert match, message
    return parse_size(match.group(1))


def mem_total() -> int:
    """The host's MemTotal, bytes."""
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("MemTotal:"))


def test_greedy_clients_meet_the_default_total_and_the_oom_killer_first(daemon):
    arbiter, pipe_dir = daemon
    honest = honest_client(pipe_dir)
    greedy, other = Allocator(pipe_dir, "greedy"), Allocator(pipe_dir, "other")
    try:
        refused = greedy.alloc(4 * mem_total())  # shared buffers: nothing would be touched if one were granted
        assert refused.startswith("QuotaExceeded"), refused
        # the default total: 3/4 of the host's available memory; on a GPU its device-local heap if smaller
        assert re.search(r"3/4 of the host memory|the device-local heap", refused), refused
        total = total_limit_in(refused)
        assert 0 < total < mem_total()

        chunk = min(total // 8, 1 << 30) // 4096 * 4096  # lavapipe makes no buffer of 4G or more
        count = total // chunk + 1  # together past the total, each of them well under it
        assert [greedy.alloc(chunk) for _ in range(count // 2)] == ["ok"] * (count // 2)
        replies = [other.alloc(chunk) for _ in range(count - count // 2)]
        assert replies[0] == "ok" and replies[-1].startswith("QuotaExceeded: allocating")
        assert total_limit_in(replies[-1]) == total

        def oom_score_adj(pid: int) -> int:
            return int(Path(f"/proc/{pid}/oom_score_adj").read_text())

        assert oom_score_adj(arbiter.pid) < oom_score_adj(greedy.process.pid)
    finally:
        greedy.close()
        other.close()
    finished_right(honest)


def test_the_total_counts_every_client_and_both_kinds_of_buffer(tmp_path, vulkan_device_name):
    for arbiter, pipe_dir in run_daemon(tmp_path / "pipe", LIBSHARE_DEVICE_MEM_TOTAL="40M"):
        honest = honest_client(pipe_dir, rounds=20)  # a few dozen KiB at a time
        with libshare.connect(name="first", mode="daemon", pipe_directory=pipe_dir) as first, \
                libshare.connect(name="second", mode="daemon", pipe_directory=pipe_dir) as second:
            held = first.alloc(16 * M, "device")
            shared = first.alloc(16 * M)  # first holds 32M: under its own limit (none), and under the total
            for kind in ("shared", "device"):
                with pytest.raises(QuotaExceeded, match=r"past the total limit of 40M \(LIBSHARE_DEVICE_MEM_TOTAL\)"):
                    second.alloc(16 * M, kind)
            first.copy(held, shared, 4096).wait(30)  # used, and so cleared: freeing it gives its memory back
            first.free(held)
            second.alloc(16 * M, "device")
            first.free(shared)
        finished_right(honest)
        assert arbiter.poll() is None


# -------------------------------------------------------------------- same-uid snooping


def secret_holder(pipe_dir: str) -> None:
    """Client role: a vadd on shared buffers, checked; prints 'ready', then checks again after a line on stdin."""
    with libshare.connect(name="secret", mode="daemon", pipe_directory=pipe_dir) as session:
        job = workloads.prepare("vadd", session, np.random.default_rng(5), {})
        job.dispatch().wait(30)
        job.check()
        print("ready", flush=True)
        sys.stdin.readline()
        job.dispatch().wait(30)
        job.check()
    print("ok", flush=True)


ATTACK = """
import os, sys
pid = sys.argv[1]
try:
    os.listdir(f"/proc/{pid}/fd")
    print("listed")
except PermissionError:
    pass
for n in range(1024):
    try:
        fd = os.open(f"/proc/{pid}/fd/{n}", os.O_RDONLY)
    except PermissionError:
        continue
    except OSError:
        print("reached", n)
        continue
    print("opened", n, os.readlink(f"/proc/self/fd/{fd}"))
"""


class UserProcesses:
    """Processes of one unprivileged user: ``nobody`` when the tests run as root, else the tests' own user.

    Root may read any process's /proc entries, so the attacker, and with it the arbiter and
    its client, must run as someone else. They get their own HOME and a Python that user can
    run: this interpreter if it can, else the system's of the same version with this
    environment's packages (a ``sitecustomize`` in a directory on PYTHONPATH adds them).
    """

    def __init__(self):
        self.user = NOBODY if os.getuid() == 0 else None
        self.home = Path(tempfile.mkdtemp(prefix="libshare-nobody-"))
        boot = self.home / "boot"
        boot.mkdir()
        site = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
        (boot / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({site!r})\n")
        for path in (self.home, boot, boot / "sitecustomize.py"):
            if self.user is not None:
                os.chown(path, self.user, self.user)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("LIBSHARE_", "XDG_", "PYTHON"))}
        self.env.update(HOME=str(self.home), PYTHONPATH=str(boot))
        system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
        failures = []
        for python in (sys.executable, system):
            try:
                probe = self.run([python, "-c", "import libshare.arbiter.device, numpy"], stderr=subprocess.PIPE)
            except OSError as exc:
                failures.append(f"{python}: {exc}")
                continue
            errors = probe.communicate(timeout=60)[1]
            if probe.returncode == 0:
                self.python = python
                return
            failures.append(f"{python}: {errors[-300:]}")
        self.close()
        pytest.skip(f"no Python that uid {self.user} can run imports libshare: {'; '.join(failures)}")

    def run(self, argv, **kwargs) -> subprocess.Popen:
        """Start ``argv`` as the user, in the repository, with text pipes as asked."""
        user = {} if self.user is None else {"user": self.user, "group": self.user, "extra_groups": []}
        return subprocess.Popen(argv, cwd=ROOT, env=self.env, text=True, **user, **kwargs)

    def close(self) -> None:
        """Remove the user's HOME (the pipe directory is inside)."""
        shutil.rmtree(self.home, ignore_errors=True)


def test_same_uid_processes_cannot_open_the_arbiters_memfds(vulkan_device_name):
    user = UserProcesses()
    try:
        pipe_dir = user.home / "pipe"
        with open(user.home / "arbiter.stderr", "w") as stderr:
            arbiter = user.run([user.python, "-m", "libshare.arbiter", "--pipe-directory", str(pipe_dir)],
                               stderr=stderr)
        try:
            wait_until(lambda: (pipe_dir / "control").exists() or arbiter.poll() is not None, 60, "the arbiter")
            assert arbiter.poll() is None, (user.home / "arbiter.stderr").read_text()[-2000:]
            uid = os.getuid() if user.user is None else user.user
            assert f"\nUid:\t{uid}\t" in Path(f"/proc/{arbiter.pid}/status").read_text()
            client = user.run([user.python, "-m", "tests.arbiter.test_memory_isolation", "secret_holder",
                               str(pipe_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert client.stdout.readline().strip() == "ready"  # its buffers are memfds the arbiter holds open

            attacker = user.run([user.python, "-c", ATTACK, str(arbiter.pid)], stdout=subprocess.PIPE)
            report = attacker.communicate(timeout=60)[0]
            assert attacker.returncode == 0 and report == "", report  # nothing listed, opened or even reached

            output = client.communicate("go\n", timeout=60)[0]
            assert (client.returncode, output.strip()) == (0, "ok")
            assert arbiter.poll() is None
        finally:
            stop_process(arbiter)
    finally:
        user.close()


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])


PUSH_DUMP = """#version 450
layout(local_size_x = 1) in;
layout(std430, binding = 0) buffer O { uint o[]; };
layout(push_constant) uniform Push { uint w[32]; } pc;
void main() { for (int i = 0; i < 32; i++) o[i] = pc.w[i]; }
"""


def test_push_constants_a_dispatch_did_not_push_read_as_zeros_not_another_clients(daemon, tmp_path):
    """A kernel that declares 128 bytes of push constants, dispatched with none, read what the last
    push left: another client's secret, in about 40% of dispatches batched beside that client's (found by
    a hostile-tenant review). The engine now pushes every declared byte, zeros past the client's own."""
    from tests.arbiter._spirv_attacks import compile_glsl, have_tools

    if have_tools() is not None:
        pytest.skip(have_tools())
    _, pipe_dir = daemon
    module = compile_glsl(PUSH_DUMP, tmp_path, "push_dump")
    secret = struct.pack("32I", *(0xC0FFEE00 + i for i in range(32)))
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir, name="victim") as victim, \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir, name="reader") as reader:
        victims_program, victims_out = victim.load_program(module), victim.array(64, np.uint32)
        program, out = reader.load_program(module), reader.array(64, np.uint32)
        seen = set()
        for _ in range(300):
            victims = [victim.dispatch(victims_program, 1, [victims_out], secret) for _ in range(16)]
            out[:] = 0xFFFFFFFF
            reader.dispatch(program, 1, [out], b"").wait(10)  # queued beside the victim's 16
            seen.update(int(w) for w in out[:32])
            victims[-1].wait(10)
        assert np.all(victims_out[:32] == np.frombuffer(secret, np.uint32))  # the victim's own pushes arrive
        assert seen == {0}, f"a dispatch that pushed nothing read {sorted(seen)[:4]}"


SHARED_READ = """#version 450
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer O { uint o[]; };
shared uint sh[4096];
void main() {
  for (uint i = gl_LocalInvocationID.x; i < 4096; i += 64) o[gl_WorkGroupID.x * 4096 + i] = sh[i];
}
"""

SHARED_WRITE = """#version 450
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer O { uint o[]; };
shared uint sh[4096];
void main() {
  for (uint i = gl_LocalInvocationID.x; i < 4096; i += 64) sh[i] = 0xC0FFEE00u + (i & 255u);
  barrier();
  if (gl_LocalInvocationID.x == 0) o[gl_WorkGroupID.x] = sh[5];
}
"""


def test_shared_memory_a_kernel_did_not_write_reads_as_zeros_not_another_clients(daemon, tmp_path):
    """Workgroup memory that a kernel reads before writing held what the last workgroup on that
    thread left: another client's words in every one of 30,560 dispatches (hostile-tenant review).
    Every module is now compiled with its shared memory zero-initialized."""
    from tests.arbiter._spirv_attacks import compile_glsl, have_tools

    if have_tools() is not None:
        pytest.skip(have_tools())
    _, pipe_dir = daemon
    reader_module = compile_glsl(SHARED_READ, tmp_path, "shared_read")
    writer_module = compile_glsl(SHARED_WRITE, tmp_path, "shared_write")
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir, name="victim") as victim, \
            libshare.connect(mode="daemon", pipe_directory=pipe_dir, name="reader") as reader:
        writer, written = victim.load_program(writer_module), victim.array(64, np.uint32)
        program, out = reader.load_program(reader_module), reader.array(16 * 4096, np.uint32)
        nonzero = 0
        for _ in range(30):
            victim.dispatch(writer, 16, [written]).wait(10)  # shared memory full of the victim's words
            victims = [victim.dispatch(writer, 16, [written]) for _ in range(8)]
            out[:] = 0xFFFFFFFF
            reader.dispatch(program, 16, [out]).wait(10)
            nonzero += int(np.count_nonzero(out))
            victims[-1].wait(10)
        assert np.all(written[:16] == 0xC0FFEE05)  # the victim's kernel used its shared memory
        assert nonzero == 0, f"{nonzero} words of shared memory the reader never wrote were not zero"
