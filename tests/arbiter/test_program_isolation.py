"""Untrusted programs (issue 11): no client's SPIR-V can crash, read through or starve the arbiter.

Every test performs an attack against a real daemon arbiter on lavapipe while an honest
client is connected to the same daemon; after the attack the honest client's saxpy
results are checked against numpy and the arbiter process must still be alive. The
hostile modules are built at test time (``_spirv_attacks.py``). The mutation fuzz is
seeded: ``LIBSHARE_FUZZ_SEED`` and ``LIBSHARE_FUZZ_MUTANTS`` change the run, and a
failure names the seed and mutant index that rebuild the module alone.

The stall tests read no clock: an honest round trip must begin and end while a long
hostile request is still under way (one that the drain thread or the queue waited for
would hold every honest round trip until it ended), and a short one must be refused or
served without compiling on the queue (the shader cache the vetting filled). How long the
honest client went without a completion meanwhile is a figure of
bench/test_engine_mechanism_bench.py. ``tools/attack_programs.py`` is the long version of
this file.
"""

from __future__ import annotations

import os
import struct
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import libshare
from libshare.protocol import wire as _protocol

from tests.arbiter import _spirv_attacks as attacks
from tests.arbiter.conftest import run_daemon, wait_until

pytestmark = pytest.mark.skipif(attacks.have_tools() is not None, reason=str(attacks.have_tools()))

FUZZ_SEED = int(os.environ.get("LIBSHARE_FUZZ_SEED", "11"))
FUZZ_MUTANTS = int(os.environ.get("LIBSHARE_FUZZ_MUTANTS", "1000"))


# ------------------------------------------------------------------ the honest client

class Honest:
    """A well-behaved client: saxpy on fresh random data, checked against numpy."""

    N = 4096

    def __init__(self, session: libshare.Session, seed: int = 0):
        self.session = session
        self.program = session.load_program(libshare.shaders.path("saxpy"))
        self.x, self.y = session.array(self.N), session.array(self.N)
        self.rng = np.random.default_rng(seed)
        self.round_trips = 0

    def round_trip(self) -> None:
        x = self.rng.standard_normal(self.N).astype(np.float32)
        y = self.rng.standard_normal(self.N).astype(np.float32)
        a = np.float32(self.rng.uniform(-4, 4))
        self.x[:], self.y[:] = x, y
        self.session.dispatch(self.program, self.N // 64, [self.x, self.y], struct.pack("If", self.N, a)).wait(120)
        np.testing.assert_allclose(self.y, a * x + y, rtol=1e-5, atol=1e-5)
        self.round_trips += 1


def _fate(arbiter) -> str:
    """Whether the arbiter lives, for a failure message (a process that just closed its sockets may be dying)."""
    try:
        arbiter.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return "alive"
    return f"dead, exit status {arbiter.returncode}"


def stderr_tail(pipe_dir) -> str:
    path = pipe_dir.parent / f"{pipe_dir.name}.stderr"
    return path.read_text()[-3000:] if path.exists() else ""


def assert_unharmed(arbiter, pipe_dir, honest: Honest) -> None:
    """The arbiter lives, the honest client computes right, and a fresh client can load programs."""
    assert arbiter.poll() is None, f"the arbiter died (exit {arbiter.returncode}): {stderr_tail(pipe_dir)}"
    for _ in range(3):
        honest.round_trip()
    with libshare.connect(name="latecomer", mode="daemon", pipe_directory=pipe_dir) as late:
        late.free(late.load_program(libshare.shaders.path("vadd")))
    assert arbiter.poll() is None


def refusal(session: libshare.Session, module: bytes) -> libshare.InvalidSubmission:
    """Load ``module``, which must be refused with InvalidSubmission (and nothing else); return the error."""
    try:
        program = session.load_program(module)
    except libshare.InvalidSubmission as exc:
        return exc
    except libshare.LibshareError as exc:
        pytest.fail(f"refused with {type(exc).__name__}, not InvalidSubmission: {exc}")
    session.free(program)
    pytest.fail("the module was accepted")


def names(exc: BaseException, *texts: str) -> bool:
    """True when the error's message contains one of ``texts`` (case-insensitive)."""
    message = str(exc).lower()
    return any(text.lower() in message for text in texts)


def honest_during(honest: Honest, action):
    """Run ``action()`` while ``honest`` does round trips in a thread.

    Returns (what ``action`` returned or raised, how many honest round trips began after it
    began and ended before it ended). The honest thread has made three round trips before
    ``action`` starts. The order is the order of the events in one list, not of clock readings.
    """
    stop, events, failures = threading.Event(), [], []

    def loop():
        try:
            while not stop.is_set():
                events.append(("begin", honest.round_trips))
                honest.round_trip()
                events.append(("end", honest.round_trips - 1))
        except BaseException as exc:  # reported by the caller
            failures.append(exc)

    thread = threading.Thread(target=loop, name="honest", daemon=True)
    thread.start()
    wait_until(lambda: honest.round_trips >= 3 or failures, 120, "three honest round trips before the attack")
    events.append(("action", "began"))
    try:
        outcome = action()
    except libshare.LibshareError as exc:
        outcome = exc
    finally:
        events.append(("action", "ended"))
        stop.set()
        thread.join(timeout=300)
    assert not thread.is_alive(), "the honest client's round trip never came back"
    assert not failures, f"the honest client failed: {failures[0]!r}"
    began, ended = events.index(("action", "began")), events.index(("action", "ended"))
    starts = {k for kind, k in events[began:ended] if kind == "begin"}
    return outcome, sum(1 for kind, k in events[began:ended] if kind == "end" and k in starts)


def assert_not_stalled(inside: int, what: str) -> None:
    """An honest round trip began and ended while ``what`` was under way: the request held nothing
    the others need (a request served on the drain thread, or a compile on the queue, holds every
    honest round trip that begins meanwhile until it ends)."""
    assert inside >= 1, f"no honest round trip went through while {what} was under way: the others waited for it"


def shader_cache_entries(pipe_dir) -> int:
    """Files in the arbiter's shader cache (Mesa's, in the pipe directory unless the environment
    names another; none on a driver that keeps its own elsewhere)."""
    cache = Path(os.environ.get("MESA_SHADER_CACHE_DIR") or pipe_dir / "shader-cache")
    return sum(len(files) for _, _, files in os.walk(cache))


@pytest.fixture
def daemons(tmp_path, vulkan_device_name):
    """``start(**env)`` starts a daemon arbiter with extra environment; returns (process, pipe dir)."""
    running = []

    def start(**env):
        generator = run_daemon(tmp_path / f"pipe{len(running)}", **env)
        running.append(generator)
        return next(generator)

    yield start
    for generator in running:
        next(generator, None)


@pytest.fixture
def attack_dir(tmp_path):
    return tmp_path / "spirv"


def connect(pipe_dir, name):
    return libshare.connect(name=name, mode="daemon", pipe_directory=pipe_dir)


# ------------------------------------------------------------------ 1. refused features

def test_buffer_reference_module_is_refused_naming_the_capability(daemon, attack_dir):
    arbiter, pipe_dir = daemon
    module = attacks.buffer_reference(attack_dir)
    with connect(pipe_dir, "honest") as mine, connect(pipe_dir, "hostile") as theirs:
        honest = Honest(mine)
        honest.round_trip()
        error = refusal(theirs, module)
        assert names(error, "capability PhysicalStorageBufferAddresses"), error
        assert_unharmed(arbiter, pipe_dir, honest)


def misjudged(session: libshare.Session, arbiter, cases) -> list[str]:
    """Load each (name, module, texts) case, which must be refused with InvalidSubmission naming one of
    ``texts`` (any message when there are none); return what went otherwise, stopping if the arbiter is lost."""
    wrong = []
    for name, module, texts in cases:
        try:
            program = session.load_program(module)
        except libshare.InvalidSubmission as exc:
            if texts and not names(exc, *texts):
                wrong.append(f"{name}: refused, but the message names none of {texts}: {exc}")
            continue
        except libshare.LibshareError as exc:
            wrong.append(f"{name}: {type(exc).__name__} (not InvalidSubmission): {exc}")
            if isinstance(exc, libshare.ArbiterLost):
                wrong.append(f"the arbiter: {_fate(arbiter)}")
                break
            continue
        session.free(program)
        wrong.append(f"{name}: accepted")
    return wrong


def test_each_refused_feature_is_refused_naming_it(daemon, attack_dir):
    """One module per capability, extension, addressing model and storage class outside the whitelist."""
    arbiter, pipe_dir = daemon
    with connect(pipe_dir, "honest") as mine, connect(pipe_dir, "hostile") as theirs:
        honest = Honest(mine)
        cases = [(f"{a.name} ({a.why})", a.module, a.expect) for a in attacks.feature_attacks(attack_dir)]
        wrong = misjudged(theirs, arbiter, cases)
        assert not wrong, "\n".join(wrong)
        assert_unharmed(arbiter, pipe_dir, honest)


def test_honest_kernels_beyond_saxpy_still_load_and_run(daemon, attack_dir):
    """The whitelist keeps what compute kernels use: shared memory, barriers, atomics, subgroups."""
    arbiter, pipe_dir = daemon
    module = attacks.compile_glsl(attacks.HONEST_FANCY_GLSL, attack_dir, "fancy")
    with connect(pipe_dir, "fancy") as session:
        for name in libshare.shaders.names():
            session.free(session.load_program(libshare.shaders.path(name)))
        program = session.load_program(module)
        x, out = session.array(256), session.array(2 + 256)
        x[:] = np.random.default_rng(3).standard_normal(256).astype(np.float32)
        session.dispatch(program, 4, [x, out]).wait(60)
        assert out[:2].view(np.uint32)[0] == 256
        np.testing.assert_array_equal(out[2:], x.reshape(4, 64)[:, ::-1].ravel())
    assert arbiter.poll() is None


# ------------------------------------------------------------------ 2. mutation fuzz

def test_mutated_shipped_shaders_are_loaded_or_refused_and_never_hurt_the_arbiter(daemon):
    arbiter, pipe_dir = daemon
    mutator = attacks.Mutator(FUZZ_SEED)
    print(f"mutation fuzz: seed {FUZZ_SEED} (LIBSHARE_FUZZ_SEED), {FUZZ_MUTANTS} mutants")
    outcomes = {"loaded": 0, "refused": 0}
    started = time.monotonic()
    with connect(pipe_dir, "honest") as mine, connect(pipe_dir, "fuzzer") as theirs:
        honest = Honest(mine)
        for index, description, module in mutator.mutants(FUZZ_MUTANTS):
            try:
                program = theirs.load_program(module)
            except libshare.InvalidSubmission:
                outcomes["refused"] += 1
                continue
            except Exception as exc:
                pytest.fail(f"mutant {index} of seed {FUZZ_SEED} ({description}) raised {type(exc).__name__}: {exc}\n"
                            f"arbiter: {_fate(arbiter)}; rebuild it with "
                            f"tests.arbiter._spirv_attacks.Mutator({FUZZ_SEED}).mutant({index}), "
                            f"rerun with LIBSHARE_FUZZ_SEED={FUZZ_SEED}\n{stderr_tail(pipe_dir)}")
            outcomes["loaded"] += 1
            theirs.free(program)
        print(f"mutation fuzz: {outcomes} in {time.monotonic() - started:.1f} s")
        assert_unharmed(arbiter, pipe_dir, honest)


@pytest.mark.parametrize("bound", [0xFFFFFFFF, 0x80000000, 1 << 26])
def test_a_huge_id_bound_is_refused(daemon, bound):
    """Issue 11: saxpy with its id bound at 2^32-1 makes Mesa segfault; 2^26 compiles for seconds in GiBs."""
    arbiter, pipe_dir = daemon
    with connect(pipe_dir, "honest") as mine, connect(pipe_dir, "hostile") as theirs:
        honest = Honest(mine)
        error = refusal(theirs, attacks.header(attacks.shipped("saxpy"), 3, bound))
        assert names(error, "id bound", "too large"), error
        assert_unharmed(arbiter, pipe_dir, honest)


def test_modules_that_killed_the_arbiter_are_refused(daemon):
    """Regression cases: id bounds, byte flips and truncations that made Mesa segfault or corrupt its heap."""
    arbiter, pipe_dir = daemon
    with connect(pipe_dir, "honest") as mine, connect(pipe_dir, "hostile") as theirs:
        honest = Honest(mine)
        wrong = misjudged(theirs, arbiter, [(what, module, ()) for what, module in attacks.known_killers()])
        assert not wrong, "\n".join(wrong)
        assert_unharmed(arbiter, pipe_dir, honest)


# ------------------------------------------------------------------ 3. stalls and the compile time limit

def test_a_slow_compile_does_not_stall_other_clients(daemons, attack_dir):
    """A 2 KiB valid module whose pipeline takes seconds to create (forced unrolling in NIR), and far
    longer to run once (llvmpipe's machine-code compile): the vetting compile's time limit refuses it,
    and nobody else waits meanwhile (a 10 s limit of CPU: the default's 60 s would only make the test longer)."""
    arbiter, pipe_dir = daemons(LIBSHARE_COMPILE_TIMEOUT="10")
    module = attacks.slow_compile(attack_dir, 256, time.time_ns())
    with connect(pipe_dir, "honest") as mine, connect(pipe_dir, "hostile") as theirs:
        honest = Honest(mine)
        outcome, inside = honest_during(honest, lambda: theirs.load_program(module))
        if isinstance(outcome, libshare.Program):
            theirs.free(outcome)
        else:
            assert isinstance(outcome, libshare.InvalidSubmission) and names(outcome, "compil"), repr(outcome)
        assert_not_stalled(inside, "the hostile load")
        assert_unharmed(arbiter, pipe_dir, honest)


def test_a_compile_past_the_time_limit_is_refused(daemons, attack_dir):
    arbiter, pipe_dir = daemons(LIBSHARE_COMPILE_TIMEOUT="1")
    module = attacks.slow_compile(attack_dir, 256, time.time_ns())
    with connect(pipe_dir, "honest") as mine, connect(pipe_dir, "hostile") as theirs:
        honest = Honest(mine)
        outcome, inside = honest_during(honest, lambda: refusal(theirs, module))  # a 1 s compile at least
        assert names(outcome, "compil"), outcome
        assert_not_stalled(inside, "the hostile load")
        assert names(refusal(theirs, module), "compil")  # refused again, whoever asks
        assert_unharmed(arbiter, pipe_dir, honest)


def test_a_first_dispatch_that_compiles_for_seconds_does_not_stall_other_clients(daemons, attack_dir,
                                                                                  vulkan_device_is_cpu):
    """llvmpipe compiles machine code lazily, at a pipeline's first dispatch: this 2 KiB module
    creates in 0.03 s and then holds the queue for about 5 s (unroll 32; 16 gives 0.8 s, 48 gives
    19 s). The vetting child's trial dispatch pays that compile and fills Mesa's shader cache, so the
    arbiter's own first dispatch loads the machine code instead of compiling it on the queue: on
    lavapipe, the load adds entries to the cache, and the first dispatch none (a compile on the
    queue stores what it compiled). How long the honest client went without a completion during
    that dispatch: bench/test_engine_mechanism_bench.py."""
    arbiter, pipe_dir = daemons(LIBSHARE_COMPILE_TIMEOUT="120")  # the trial must pass: what follows is the test
    module = attacks.slow_compile(attack_dir, 32, time.time_ns())
    with connect(pipe_dir, "honest") as mine, connect(pipe_dir, "hostile") as theirs:
        honest = Honest(mine)
        before_vetting = shader_cache_entries(pipe_dir)
        program = theirs.load_program(module)  # vetted: the trial dispatch compiled it in a child
        data = theirs.array(64)
        vetted = shader_cache_entries(pipe_dir)

        def first_dispatch():
            return theirs.dispatch(program, 1, [data], struct.pack("If", 64, 0.5)).wait(300)

        outcome, _ = honest_during(honest, first_dispatch)
        assert isinstance(outcome, libshare.Ticket), repr(outcome)
        if vulkan_device_is_cpu:  # Mesa's cache; a GPU driver keeps its own, elsewhere
            assert vetted > before_vetting, "the vetting filled no shader cache"
            assert shader_cache_entries(pipe_dir) == vetted, "the arbiter's first dispatch compiled on the queue"
        assert_unharmed(arbiter, pipe_dir, honest)


# ------------------------------------------------------------------ 4. program caps

def test_a_client_past_its_program_cap_gets_quota_exceeded_and_others_load(daemons):
    arbiter, pipe_dir = daemons(LIBSHARE_MAX_PROGRAMS="8")
    saxpy = attacks.shipped("saxpy")
    with connect(pipe_dir, "honest") as mine, connect(pipe_dir, "hoarder") as theirs:
        honest = Honest(mine)  # holds one program of its eight
        held = [theirs.load_program(attacks.distinct(saxpy, n)) for n in range(8)]
        with pytest.raises(libshare.QuotaExceeded):
            theirs.load_program(attacks.distinct(saxpy, 8))
        with pytest.raises(libshare.QuotaExceeded):  # a module it already holds counts again
            theirs.load_program(attacks.distinct(saxpy, 0))
        mine_too = [mine.load_program(attacks.distinct(saxpy, 100 + n)) for n in range(3)]
        mine_too.append(mine.load_program(attacks.distinct(saxpy, 0)))  # one the hoarder holds
        theirs.free(held.pop())
        held.append(theirs.load_program(attacks.distinct(saxpy, 9)))  # a freed program frees its place
        for program in mine_too:
            mine.free(program)
        assert_unharmed(arbiter, pipe_dir, honest)


def test_loading_one_module_repeatedly_counts_each_load_against_the_default_cap(daemon):
    arbiter, pipe_dir = daemon
    saxpy = attacks.shipped("vadd")
    with connect(pipe_dir, "honest") as mine, connect(pipe_dir, "hoarder") as theirs:
        honest = Honest(mine)
        held = [theirs.load_program(saxpy) for _ in range(256)]
        assert len({program.id for program in held}) == 256
        with pytest.raises(libshare.QuotaExceeded):
            theirs.load_program(saxpy)
        mine.free(mine.load_program(saxpy))
        assert_unharmed(arbiter, pipe_dir, honest)


def test_all_clients_together_are_capped_at_4096_programs(daemons):
    arbiter, pipe_dir = daemons(LIBSHARE_MAX_PROGRAMS="256")
    vadd = attacks.shipped("vadd")
    with connect(pipe_dir, "honest") as mine:
        honest = Honest(mine)  # one program
        hoarders, refused, held = [], None, 0
        try:
            while refused is None and len(hoarders) < 17:
                hoarder = connect(pipe_dir, f"hoarder{len(hoarders)}")
                hoarders.append(hoarder)
                for _ in range(256):
                    try:
                        hoarder.load_program(vadd)
                    except libshare.QuotaExceeded as exc:
                        refused = exc
                        break
                    held += 1
            assert refused is not None, "17 clients held 256 programs each"
            assert (len(hoarders), held + 1) == (16, 4096), "the total cap is not 4096 programs"
            assert names(refused, "4096"), refused
            hoarders.pop().close()
            hoarders.pop().close()
            wait_until(lambda: _loads(mine, vadd), 30, "a load once two hoarders left")
        finally:
            for hoarder in hoarders:
                hoarder.close()
        assert_unharmed(arbiter, pipe_dir, honest)


def _loads(session, module) -> bool:
    try:
        session.free(session.load_program(module))
    except libshare.QuotaExceeded:
        return False
    return True


# ------------------------------------------------------------------ 5. size bound

def test_a_module_over_the_size_bound_is_refused_without_stalling_others(daemon):
    """Nearly 4 MiB of valid constants (the most one request carries): refused before any compile
    (the shader cache takes no entry for it), with the honest client's round trips going on."""
    arbiter, pipe_dir = daemon
    module = attacks.padded(attacks.shipped("saxpy"), _protocol.MAX_FRAME - (64 << 10))
    with connect(pipe_dir, "honest") as mine, connect(pipe_dir, "hostile") as theirs:
        honest = Honest(mine)
        honest.round_trip()  # saxpy's machine code in the cache already
        cached = shader_cache_entries(pipe_dir)
        outcome, _ = honest_during(honest, lambda: refusal(theirs, module))
        assert names(outcome, "too large"), outcome
        assert shader_cache_entries(pipe_dir) == cached, "the module was compiled before it was refused"
        assert_unharmed(arbiter, pipe_dir, honest)
