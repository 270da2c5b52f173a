"""The C API: libshare.so built from bindings/c, its generated header, C tests and examples.

The library is built once per session into a temporary folder; the C test
programs print "N passed, N failed" as their last line, read here. Each runs
against the embedded default (no daemon at the pipe directory) and against a
real daemon. Without a C compiler, pkg-config or Python headers these tests
skip, or fail under LIBSHARE_REQUIRE_VULKAN=1 (CI).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import libshare

from tests.arbiter._specialized import SOURCE as SPECIALIZED
from tests.arbiter.test_runtime_arrays import PICK
from tests.arbiter.conftest import daemon, wait_until  # noqa: F401 - the daemon fixture
from tests.conftest import ROOT, killed_on_exit, vulkan_required

C_DIR = ROOT / "bindings" / "c"
SHADERS = ROOT / "shaders"
RESULT_LINE = re.compile(r"^(\d+) passed, (\d+) failed$")

pytestmark = pytest.mark.usefixtures("vulkan_device_name")


def _missing(message: str):
    if vulkan_required():
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def library(tmp_path_factory) -> Path:
    """Build libshare.so and libshare.pc into a temporary folder; return the .pc path."""
    for tool in ("cc", "c++", "pkg-config"):
        if shutil.which(tool) is None:
            _missing(f"{tool} is not installed (apt-get install gcc g++ pkg-config)")
    out = tmp_path_factory.mktemp("libshare-c")
    done = subprocess.run([sys.executable, str(C_DIR / "build.py"), "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0 and "Python.h" in done.stderr:
        _missing(f"Python headers are missing (apt-get install python3-dev): {done.stderr[-500:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "libshare.pc"


def compile_c(library: Path, source: Path, out: Path, *extra: str) -> Path:
    """Compile and link one C program against libshare with the flags pkg-config gives."""
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", str(library)], capture_output=True, text=True,
                           check=True).stdout.split()
    binary = out / source.stem
    done = subprocess.run(["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", str(source), "-o", str(binary),
                           *flags, "-pthread", "-lm", *extra], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return binary


def run_c(binary: Path, env: dict, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run a C program with the given environment, from a scratch folder."""
    return subprocess.run([str(binary), *args], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=binary.parent)


def counts(output: str) -> tuple[int, int]:
    """(passed, failed) from the runner's closing line."""
    last = output.strip().splitlines()[-1] if output.strip() else ""
    match = RESULT_LINE.match(last)
    assert match, f"no closing 'N passed, N failed' line in:\n{output[-3000:]}"
    return int(match[1]), int(match[2])


def embedded_env(tmp_path: Path) -> dict:
    """An environment where no daemon answers: the default mode embeds the arbiter."""
    env = {k: v for k, v in os.environ.items() if k != "LIBSHARE_MODE"}
    env["LIBSHARE_PIPE_DIRECTORY"] = str(tmp_path / "nobody-listens")
    return env


def daemon_env(pipe_dir: Path) -> dict:
    """An environment that insists on the daemon at ``pipe_dir``."""
    return dict(os.environ, LIBSHARE_MODE="daemon", LIBSHARE_PIPE_DIRECTORY=str(pipe_dir))


# ---------------------------------------------------------------- the header

def generate(*args: str) -> subprocess.CompletedProcess:
    """Run bindings/c/generate.py with ``args``."""
    return subprocess.run([sys.executable, str(C_DIR / "generate.py"), *args], cwd=ROOT, capture_output=True,
                          text=True)


def test_header_is_generated_from_the_declaration_sources(tmp_path):
    done = generate("--check")
    assert done.returncode == 0, done.stderr
    fresh = tmp_path / "libshare.h"
    assert generate("--header", str(fresh)).returncode == 0
    text = fresh.read_text()
    assert text == (C_DIR / "libshare.h").read_text()
    assert "int ls_dispatch(" in text and "struct ls_desc {" in text and "lsx_py_" not in text


def test_header_check_notices_a_stale_copy(tmp_path):
    stale = tmp_path / "libshare.h"
    stale.write_text((C_DIR / "libshare.h").read_text().replace("LS_API_VERSION 1", "LS_API_VERSION 0"))
    done = generate("--check", "--header", str(stale))
    assert done.returncode == 1 and "stale" in done.stderr


def test_error_messages_are_generated_from_the_error_table(tmp_path):
    fresh = tmp_path / "errors_table.h"
    assert generate("--errors", str(fresh)).returncode == 0
    text = fresh.read_text()
    assert text == (C_DIR / "errors_table.h").read_text()
    for row in libshare.errors.TABLE:  # every LS_E* code's message, as Python gives it
        assert (f"case {row.name}: return {json.dumps(row.message)};" in text) == row.name.startswith("LS_")


def test_error_messages_check_notices_a_stale_copy(tmp_path):
    stale = tmp_path / "errors_table.h"
    stale.write_text((C_DIR / "errors_table.h").read_text().replace('"timed out"', '"timeout"'))
    done = generate("--check", "--errors", str(stale))
    assert done.returncode == 1 and "stale" in done.stderr


def test_every_error_code_of_the_c_headers_has_one_row_in_the_error_table():
    defined = re.findall(r"^#define (LS_E[A-Z]+) \d+", (ROOT / "libshare" / "ring" / "ring.h").read_text()
                         + (C_DIR / "api.h").read_text(), re.MULTILINE)
    rows = [row.name for row in libshare.errors.TABLE if row.name.startswith("LS_")]
    assert sorted(rows) == sorted(set(defined)) and len(rows) == len(set(rows))


def test_header_compiles_as_cplusplus_and_strict_c(tmp_path, library):
    program = tmp_path / "use.cpp"
    program.write_text('#include <libshare.h>\n'
                       'static_assert(sizeof(ls_desc) == LS_DESC_SIZE, "ABI");\n'
                       'int main() { ls_options o = {}; ls_session *s = nullptr;\n'
                       '  return ls_connect(&o, &s) == 0 ? 0 : (ls_strerror(-LS_ELOST) != nullptr); }\n')
    for command in (["c++", "-std=c++11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only",
                     f"-I{C_DIR}", str(program)],
                    ["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only", "-x", "c",
                     str(C_DIR / "libshare.h")]):
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, f"{' '.join(command)}:\n{done.stderr[-3000:]}"


# ---------------------------------------------------------------- the C tests

@pytest.fixture(scope="session")
def c_tests(library, tmp_path_factory) -> Path:
    return compile_c(library, C_DIR / "tests" / "test_api.c", tmp_path_factory.mktemp("c-tests"))


def check_run(done: subprocess.CompletedProcess) -> int:
    passed, failed = counts(done.stdout)
    assert failed == 0 and done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert passed > 0
    return passed


def test_c_api_embedded_default(c_tests, tmp_path):
    assert check_run(run_c(c_tests, embedded_env(tmp_path), str(SHADERS))) >= 20


def test_c_api_against_a_daemon(c_tests, daemon):
    _, pipe_dir = daemon
    assert check_run(run_c(c_tests, daemon_env(pipe_dir), str(SHADERS))) >= 20


def kernel_test(library, tmp_path_factory, name: str, source: str) -> tuple[Path, Path]:
    """bindings/c/tests/test_NAME.c built, and the GLSL kernel it loads compiled (skips without glslangValidator)."""
    if shutil.which("glslangValidator") is None:
        pytest.skip("glslangValidator is not installed (apt-get install glslang-tools)")
    folder = tmp_path_factory.mktemp(f"c-{name}")
    kernel = folder / f"{name}.spv"
    kernel.write_bytes(libshare.compile(source))
    return compile_c(library, C_DIR / "tests" / f"test_{name}.c", folder), kernel


@pytest.fixture(scope="session")
def constants_test(library, tmp_path_factory) -> tuple[Path, Path]:
    """test_constants.c built, and the kernel it loads (tests/arbiter/_specialized.py) compiled."""
    return kernel_test(library, tmp_path_factory, "constants", SPECIALIZED)


def test_c_load_program_constants_embedded(constants_test, tmp_path):
    binary, kernel = constants_test
    assert check_run(run_c(binary, embedded_env(tmp_path), str(kernel))) == 3


def test_c_load_program_constants_against_a_daemon(constants_test, daemon):
    binary, kernel = constants_test
    assert check_run(run_c(binary, daemon_env(daemon[1]), str(kernel))) == 3


@pytest.fixture(scope="session")
def arrays_test(library, tmp_path_factory) -> tuple[Path, Path]:
    """test_arrays.c built, and the kernel it loads (PICK of tests/arbiter/test_runtime_arrays.py) compiled."""
    return kernel_test(library, tmp_path_factory, "arrays", PICK)


def test_c_load_program_arrays_embedded(arrays_test, tmp_path):
    binary, kernel = arrays_test
    assert check_run(run_c(binary, embedded_env(tmp_path), str(kernel))) == 2


def test_c_load_program_arrays_against_a_daemon(arrays_test, daemon):  # noqa: F811 - the fixture
    binary, kernel = arrays_test
    assert check_run(run_c(binary, daemon_env(daemon[1]), str(kernel))) == 2


TEXEL = """#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) uniform samplerBuffer a;
layout(set = 0, binding = 1, r32ui) uniform writeonly uimageBuffer y;
void main() { int i = int(gl_GlobalInvocationID.x); imageStore(y, i, uvec4(uint(texelFetch(a, i).x * 2.0))); }
"""


@pytest.fixture(scope="session")
def texel_test(library, tmp_path_factory) -> tuple[Path, Path]:
    """test_texel.c built, and its kernel (TEXEL) compiled."""
    return kernel_test(library, tmp_path_factory, "texel", TEXEL)


def test_c_texel_views_embedded(texel_test, tmp_path):
    binary, kernel = texel_test
    assert check_run(run_c(binary, embedded_env(tmp_path), str(kernel))) == 2


@pytest.fixture(scope="session")
def indirect_test(library, tmp_path_factory) -> Path:
    """test_indirect.c built: fills, updates, timestamps and indirect dispatches, single and in a list."""
    return compile_c(library, C_DIR / "tests" / "test_indirect.c", tmp_path_factory.mktemp("c-indirect"))


def test_c_fill_update_and_indirect_dispatch_embedded(indirect_test, tmp_path):
    assert check_run(run_c(indirect_test, embedded_env(tmp_path), str(SHADERS))) == 6


def test_c_fill_update_and_indirect_dispatch_against_a_daemon(indirect_test, daemon):
    assert check_run(run_c(indirect_test, daemon_env(daemon[1]), str(SHADERS))) == 6


@pytest.mark.parametrize("how", ["wait", "poll"])
def test_c_wait_returns_when_the_daemon_dies(library, daemon, tmp_path, how):
    """No control daemon: nobody replaces the arbiter, so the C session does not reattach: the loss is sticky."""
    process, pipe_dir = daemon
    binary = compile_c(library, C_DIR / "tests" / "test_lost.c", tmp_path)
    with killed_on_exit(subprocess.Popen([str(binary), str(SHADERS), how], env=daemon_env(pipe_dir),
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)) as client:
        assert client.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGKILL)
        out, err = client.communicate(timeout=30)
    assert counts(out) == (1, 0), out + err


# ---------------------------------------------------------------- the examples

@pytest.fixture(scope="session")
def examples(library, tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("c-examples")
    return {name: compile_c(library, C_DIR / "examples" / f"{name}.c", out) for name in ("saxpy", "multi_process")}


def right_lines(done: subprocess.CompletedProcess) -> int:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return sum("result right" in line for line in done.stdout.splitlines())


def test_saxpy_example_embedded(examples, tmp_path):
    done = run_c(examples["saxpy"], embedded_env(tmp_path), str(SHADERS / "saxpy.spv"))
    assert right_lines(done) == 1 and "embedded arbiter" in done.stdout


def test_saxpy_example_against_a_daemon(examples, daemon):
    done = run_c(examples["saxpy"], daemon_env(daemon[1]), str(SHADERS / "saxpy.spv"))
    assert right_lines(done) == 1 and "(daemon)" in done.stdout


def test_multi_process_example_hosting_its_arbiter(examples, tmp_path):
    done = run_c(examples["multi_process"], embedded_env(tmp_path), str(SHADERS))
    assert right_lines(done) == 4 and "4 of 4 workers right" in done.stdout


def test_multi_process_example_against_a_daemon(examples, daemon):
    done = run_c(examples["multi_process"], daemon_env(daemon[1]), str(SHADERS), "--daemon")
    assert right_lines(done) == 4


# ---------------------------------------------------------------- surviving the arbiter

DEPTH, THREADS = 4, 2  # as in bindings/c/tests/test_reattach.c
MIN_KILLS, MAX_KILLS = 5, 12  # arbiters killed under a streaming C session (the daemon backs off
# standbys that die young: 0.25 s doubling to 4 s, so many more would take long)


@pytest.fixture(scope="session")
def reattach_program(library, tmp_path_factory) -> Path:
    return compile_c(library, C_DIR / "tests" / "test_reattach.c", tmp_path_factory.mktemp("c-reattach"))


@pytest.fixture
def supervised(tmp_path):
    from tests.arbiter.test_reattach import Daemon

    daemon = Daemon(tmp_path / "pipe")
    yield daemon
    daemon.stop()


class Streamer:
    """test_reattach in its stream mode: two threads of one C session streaming checked saxpy."""

    def __init__(self, binary: Path, pipe: Path):
        self.stderr = pipe.parent / "streamer.stderr"  # a file: a full pipe would stall the program
        with open(self.stderr, "w") as stderr:
            self.process = subprocess.Popen([str(binary), str(SHADERS), "stream"], env=daemon_env(pipe),
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True)
        self.lines: list[str] = []
        self.ok = self.restarted = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with self.process.stdout:
            for line in self.process.stdout:
                self.lines.append(line.rstrip("\n"))
                if line.startswith("progress "):
                    self.ok, self.restarted = map(int, line.split()[1:])

    def output(self) -> str:
        return "\n".join(self.lines[-20:]) + "\n" + self.stderr.read_text()[-3000:]

    def progresses(self, what: str) -> None:
        """Wait for more successes than the dead arbiter could have answered: some ran on the new one."""
        start = self.ok
        wait_until(lambda: self.ok > start + 2 * DEPTH * THREADS or self.process.poll() is not None, 120, what)
        assert self.process.poll() is None, self.output()

    def finish(self) -> tuple[int, int]:
        """Close its standard input; (ok, restarted) once it passed."""
        self.process.stdin.close()
        assert self.process.wait(timeout=120) == 0, self.output()
        self._reader.join(10)
        assert counts("\n".join(self.lines)) == (1, 0), self.output()
        return self.ok, self.restarted

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if not self.process.stdin.closed:
            self.process.stdin.close()
        self._reader.join(10)


def test_c_session_rides_out_sigkilled_arbiters(reattach_program, supervised):
    """Kills while two threads of one C session stream: the session goes on on each new arbiter with the same
    buffer pointers and program ids; no result it reported successful is wrong (the program checks each one);
    tickets in flight fail with -LS_ERESTARTED and none hangs."""
    from tests.arbiter.test_reattach import exited

    streamer = Streamer(reattach_program, supervised.pipe)
    kills = 0
    try:
        streamer.progresses("the first dispatches")
        # A kill meets work in flight unless it lands while both threads fill or check their
        # arrays, which a busy machine makes likely: kill on until one has (5 kills at least).
        while kills < MIN_KILLS or (streamer.restarted == 0 and kills < MAX_KILLS):
            wait_until(lambda: supervised.standbys() >= kills + 1, 120, "a standby arbiter")
            arbiter = supervised.arbiter()
            os.kill(arbiter, signal.SIGKILL)
            kills += 1
            assert exited(arbiter, 60)
            wait_until(lambda: supervised.arbiter() not in (arbiter, None), 60, "the standby to take over")
            streamer.progresses(f"dispatches on the arbiter after kill {kills}")
        ok, restarted = streamer.finish()
    finally:
        streamer.kill()
    assert restarted > 0, f"none of {kills} kills met work in flight"  # which failed cleanly
    assert supervised.log().count("was killed by SIGKILL") == kills


def test_c_session_restart_is_a_pause_not_an_error(reattach_program, supervised):
    from tests.arbiter.test_reattach import exited

    streamer = Streamer(reattach_program, supervised.pipe)
    try:
        streamer.progresses("the first dispatches")
        old = supervised.arbiter()
        assert "hands over" in supervised.run("restart")
        wait_until(lambda: supervised.arbiter() not in (old, None), 120, "the new arbiter")
        assert exited(old, 60)
        streamer.progresses("dispatches on the new arbiter")
        ok, restarted = streamer.finish()
    finally:
        streamer.kill()
    assert restarted == 0 and ok > 0
    assert f"arbiter pid {old} handed over and exited with status 0" in supervised.log()


@pytest.mark.parametrize("mode", ["inflight", "unrun"])
def test_c_session_after_one_kill(reattach_program, supervised, mode):
    """inflight: a ticket the dead arbiter took fails with -LS_ERESTARTED (a control call reattaches
    first); unrun: dispatches pushed into the dead arbiter's ring run once each on the new one."""
    from tests.arbiter.test_reattach import exited

    with killed_on_exit(subprocess.Popen([str(reattach_program), str(SHADERS), mode], env=daemon_env(supervised.pipe),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True)) as client:
        assert client.stdout.readline().strip() == "ready"
        arbiter = supervised.arbiter()
        os.kill(arbiter, signal.SIGKILL)
        assert exited(arbiter, 60)
        out, err = client.communicate("go\n", timeout=120)
    assert counts(out) == (1, 0), out + err
    assert supervised.arbiter() != arbiter



SERVE_ONCE = r"""
#include <errno.h>
#include <stdio.h>
#include <libshare.h>
int main(int argc, char **argv)
{
    (void)argc;
    int rc = ls_serve(argv[1]);
    printf("%d %s\n", rc, rc ? ls_error_message() : "");
    ls_serve_stop();
    return rc == -EBUSY ? 0 : 1;
}
"""


def test_ls_serve_leaves_a_directory_another_arbiter_serves_alone(library, daemon, tmp_path):
    """ls_serve on a live daemon's pipe directory renamed its own socket over the daemon's; once that
    process exited no new client could reach the daemon, and no new arbiter could start there. It now
    takes the directory's lock as a daemon does, and answers -EBUSY."""
    process, pipe_dir = daemon
    source = tmp_path / "serve_once.c"
    source.write_text(SERVE_ONCE)
    done = run_c(compile_c(library, source, tmp_path), dict(os.environ), str(pipe_dir), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert f"another arbiter (pid {process.pid}) serves" in done.stdout
    with libshare.connect(mode="daemon", pipe_directory=pipe_dir) as session:  # still the daemon's socket
        assert session.arbiter_pid == process.pid
