"""Hostile input around the Vulkan driver, each beside an honest client whose results are checked.

Toward the arbiter: a hello whose ``device_info`` is not a flag is refused, and the connection may say
hello again; the honest answer is the description device_info.py defines. Toward the driver: a listener
in the pipe directory that answers the driver's hello with a broken welcome (bad framing, lengths,
JSON, descriptors, fields) must leave the program with no device and an explanation, never a crash.
"""

from __future__ import annotations

import array
import json
import socket
import struct
import sys
import threading
from pathlib import Path

import pytest

from libshare.protocol import wire as protocol

from tests.conftest import stop_process
from tests.arbiter.conftest import start_client
from tests.icd.conftest import PROBE, environment, libshare_run, probe

HEADER = struct.Struct("<IHHII")
PROPERTIES_SIZE = 824  # sizeof(VkPhysicalDeviceProperties) on x86-64 and aarch64


def frame(body: bytes, payload: bytes = b"", magic: int = protocol.MAGIC, json_len: int | None = None) -> bytes:
    return HEADER.pack(magic, protocol.VERSION, 0, len(body) if json_len is None else json_len, len(payload)) \
        + body + payload


def test_a_hostile_device_info_flag_is_refused_beside_an_honest_client(daemon):
    _process, pipe_dir = daemon
    honest = start_client("mixed", pipe_dir, 3, 20)  # checks every result against numpy
    try:
        sock = protocol.dial(pipe_dir / "control", 30.0)
        sock.settimeout(60)
        with sock:
            for value in (1, "true", None, [True], {"": True}):
                sock.sendall(frame(json.dumps({"op": "hello", "version": 1, "device_info": value}).encode()))
                answer = protocol.recv(sock, max_fds=protocol.MAX_FDS)
                answer.close_fds()
                assert answer.fields["ok"] is False and answer.fields["error"] == "InvalidSubmission", value
            sock.sendall(frame(json.dumps({"op": "hello", "version": 1, "device_info": True}).encode()))
            welcome = protocol.recv(sock, max_fds=protocol.MAX_FDS)
            welcome.close_fds()
        described = welcome.fields["physical_device"]
        assert welcome.fields["ok"] and len(welcome.payload) == PROPERTIES_SIZE
        assert described["name"] == welcome.fields["device"] and "robustBufferAccess" in described["features"]
        assert "bufferDeviceAddress" not in described["features"] and described["memory"] > 0
        assert honest.communicate(timeout=300)[0].strip() == "ok"
    finally:
        stop_process(honest)


GOOD = {"ok": True, "client_id": 1, "physical_device": {
    "name": "fake", "uuid": "00112233-4455-6677-8899-aabbccddeeff", "features": ["robustBufferAccess"],
    "timestamp_valid_bits": 64, "memory": 1 << 30}}


def welcome(**changes) -> bytes:
    described = {**GOOD["physical_device"], **changes.pop("physical_device", {})}
    return json.dumps({**GOOD, **changes, "physical_device": described}).encode()


BROKEN = {
    "bad magic": (frame(welcome(), bytes(PROPERTIES_SIZE), magic=0x1234), 2),
    "a length past the bound": (frame(welcome(), json_len=1 << 30), 2),
    "json that is not an object": (frame(b"[1, 2, 3]", bytes(PROPERTIES_SIZE)), 2),
    "json cut short": (frame(b'{"ok": true, "client_id": 1, "physical_de', bytes(PROPERTIES_SIZE)), 2),
    "a refusal": (frame(json.dumps({"ok": False, "error": "TooManyClients", "message": "full"}).encode()), 0),
    "no descriptors": (frame(welcome(), bytes(PROPERTIES_SIZE)), 0),
    "too many descriptors": (frame(welcome(), bytes(PROPERTIES_SIZE)), 4),
    "a payload of the wrong size": (frame(welcome(), bytes(PROPERTIES_SIZE - 8)), 2),
    "no physical device": (frame(json.dumps({"ok": True, "client_id": 1}).encode(), bytes(PROPERTIES_SIZE)), 2),
    "a name too long": (frame(welcome(physical_device={"name": "n" * 300}), bytes(PROPERTIES_SIZE)), 2),
    "a name not text": (frame(welcome(physical_device={"name": 7}), bytes(PROPERTIES_SIZE)), 2),
    "a bad uuid": (frame(welcome(physical_device={"uuid": "00112233-zz"}), bytes(PROPERTIES_SIZE)), 2),
    "features not a list": (frame(welcome(physical_device={"features": "all"}), bytes(PROPERTIES_SIZE)), 2),
    "features not names": (frame(welcome(physical_device={"features": [1, None]}), bytes(PROPERTIES_SIZE)), 2),
    "too many features": (frame(welcome(physical_device={"features": ["x"] * 600}), bytes(PROPERTIES_SIZE)), 2),
    "negative memory": (frame(welcome(physical_device={"memory": -1}), bytes(PROPERTIES_SIZE)), 2),
    "fractional memory": (frame(welcome(physical_device={"memory": 1.5}), bytes(PROPERTIES_SIZE)), 2),
    "timestamp bits past 64": (frame(welcome(physical_device={"timestamp_valid_bits": 65}), bytes(PROPERTIES_SIZE)), 2),
    "a client id not a number": (frame(welcome(client_id="1"), bytes(PROPERTIES_SIZE)), 2),
}


class BrokenArbiter:
    """A listener at a pipe directory's socket that answers one hello with ``answer`` and ``fds`` descriptors
    (of /dev/null); it keeps the hello it read."""

    def __init__(self, pipe_dir: Path, answer: bytes, fds: int):
        pipe_dir.mkdir(mode=0o700)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(pipe_dir / "control"))
        self._listener.listen(1)
        self._answer, self._fds = answer, fds
        self.hello: dict | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        with conn:
            conn.settimeout(60)
            self.hello = protocol.recv(conn).fields
            try:
                with open("/dev/null") as null:
                    fds = array.array("i", [null.fileno()] * self._fds)
                    conn.sendmsg([self._answer], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)] if self._fds else [])
                conn.recv(1)  # until the driver closes its end
            except OSError:  # it may close while this still writes: it read enough to refuse
                pass

    def close(self) -> None:
        self._thread.join(60)
        self._listener.close()


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_welcome_leaves_the_program_no_device_and_no_crash(tmp_path, daemon, case):
    _process, honest_pipe = daemon
    honest = start_client("mixed", honest_pipe, 5, 4)
    answer, fds = BROKEN[case]
    arbiter = BrokenArbiter(tmp_path / "broken", answer, fds)
    try:
        seen = probe(libshare_run("--mode", "daemon", "--name", "victim", "--group", "g", "--", sys.executable,
                                  str(PROBE)), environment(tmp_path / "broken", LIBSHARE_DEVICE_MEM_LIMIT="0=1G,2M"))
    finally:
        arbiter.close()
    assert seen["error"] == "VkErrorIncompatibleDriver", seen  # the loader's answer: its only driver failed
    assert "libshare Vulkan driver:" in seen["stderr"]
    assert arbiter.hello == {"op": "hello", "name": "victim", "version": 1, "device_info": True, "group": "g",
                             "mem_limit": {"0": 1 << 30, "": 2 << 20}}
    assert honest.communicate(timeout=300)[0].strip() == "ok"
