"""Broken welcomes, and a listener that answers the driver's hello with one (tests/icd's attacks)."""

from __future__ import annotations

import array
import json
import os
import select
import socket
import struct
import threading
from pathlib import Path

from libshare.protocol import wire as protocol

HEADER = struct.Struct("<IHHII")
PROPERTIES_SIZE = 824  # sizeof(VkPhysicalDeviceProperties) on x86-64 and aarch64


def frame(body: bytes, payload: bytes = b"", magic: int = protocol.MAGIC, json_len: int | None = None) -> bytes:
    """One frame's bytes, as wire.py frames them unless ``magic`` or ``json_len`` lie."""
    return HEADER.pack(magic, protocol.VERSION, 0, len(body) if json_len is None else json_len, len(payload)) \
        + body + payload


GOOD = {"ok": True, "client_id": 1, "arbiter_pid": 1, "physical_device": {
    "name": "fake", "uuid": "00112233-4455-6677-8899-aabbccddeeff", "features": ["robustBufferAccess"],
    "timestamp_valid_bits": 64, "memory": 1 << 30, "subgroup_size": 8, "max_per_set_descriptors": 1024,
    "max_memory_allocation_size": 1 << 31, "driver_id": 13, "conformance": [1, 3, 1, 1],
    "texel_formats": [["r32f", 100, 4, 3]]}}


def welcome(**changes) -> bytes:
    """A welcome's JSON: :data:`GOOD` with ``changes`` (``physical_device``'s merged into its own)."""
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
    "a subgroup size not a power of two": (frame(welcome(physical_device={"subgroup_size": 12}), bytes(PROPERTIES_SIZE)), 2),
    "no subgroup size": (frame(welcome(physical_device={"subgroup_size": None}), bytes(PROPERTIES_SIZE)), 2),
    "descriptors past 32 bits": (frame(welcome(physical_device={"max_per_set_descriptors": 1 << 32}),
                                       bytes(PROPERTIES_SIZE)), 2),
    "an allocation size not a number": (frame(welcome(physical_device={"max_memory_allocation_size": "2G"}),
                                              bytes(PROPERTIES_SIZE)), 2),
    "a driver id not a number": (frame(welcome(physical_device={"driver_id": "llvmpipe"}), bytes(PROPERTIES_SIZE)), 2),
    "a driver id past 32 bits": (frame(welcome(physical_device={"driver_id": 1 << 32}), bytes(PROPERTIES_SIZE)), 2),
    "no conformance": (frame(welcome(physical_device={"conformance": None}), bytes(PROPERTIES_SIZE)), 2),
    "a conformance of three parts": (frame(welcome(physical_device={"conformance": [1, 3, 1]}),
                                           bytes(PROPERTIES_SIZE)), 2),
    "a conformance part past 255": (frame(welcome(physical_device={"conformance": [1, 256, 0, 0]}),
                                          bytes(PROPERTIES_SIZE)), 2),
    "a conformance part not whole": (frame(welcome(physical_device={"conformance": [1, 3, "1", -1]}),
                                           bytes(PROPERTIES_SIZE)), 2),
    "texel formats not a list": (frame(welcome(physical_device={"texel_formats": {"r32f": 3}}), bytes(PROPERTIES_SIZE)), 2),
    "too many texel formats": (frame(welcome(physical_device={"texel_formats": [["r32f", 100, 4, 3]] * 17}),
                                     bytes(PROPERTIES_SIZE)), 2),
    "a texel format's name too long": (frame(welcome(physical_device={"texel_formats": [["r" * 16, 100, 4, 3]]}),
                                             bytes(PROPERTIES_SIZE)), 2),
    "a texel size of 0": (frame(welcome(physical_device={"texel_formats": [["r32f", 100, 0, 3]]}),
                                bytes(PROPERTIES_SIZE)), 2),
    "texel uses past both": (frame(welcome(physical_device={"texel_formats": [["r32f", 100, 4, 4]]}),
                                   bytes(PROPERTIES_SIZE)), 2),
    "a texel format cut short": (frame(welcome(physical_device={"texel_formats": [["r32f", 100]]}),
                                       bytes(PROPERTIES_SIZE)), 2),
    "subgroup sizes not a list": (frame(welcome(physical_device={"subgroup_sizes": 8}), bytes(PROPERTIES_SIZE)), 2),
    "subgroup sizes cut short": (frame(welcome(physical_device={"subgroup_sizes": [8, 8]}), bytes(PROPERTIES_SIZE)),
                                 2),
    "subgroup sizes the wrong way": (frame(welcome(physical_device={"subgroup_sizes": [64, 32, 16]}),
                                           bytes(PROPERTIES_SIZE)), 2),
    "a subgroup size past 4096": (frame(welcome(physical_device={"subgroup_sizes": [8, 8192, 1]}),
                                        bytes(PROPERTIES_SIZE)), 2),
    "subgroups a workgroup holds negative": (frame(welcome(physical_device={"subgroup_sizes": [8, 8, -1]}),
                                                   bytes(PROPERTIES_SIZE)), 2),
    "a client id not a number": (frame(welcome(client_id="1"), bytes(PROPERTIES_SIZE)), 2),
    "an arbiter pid not a pid": (frame(welcome(arbiter_pid=-5), bytes(PROPERTIES_SIZE)), 2),
}


class BrokenArbiter:
    """A listener at a pipe directory's socket that answers each hello (an instance's, then a device's) with
    ``answer`` and ``fds`` descriptors (of /dev/null), and any request after it by closing the connection;
    it keeps the first hello it read (None: no one said hello)."""

    def __init__(self, pipe_dir: Path, answer: bytes, fds: int):
        pipe_dir.mkdir(mode=0o700)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(pipe_dir / "control"))
        self._listener.listen(1)
        self._answer, self._fds = answer, fds
        self.hello: dict | None = None
        self._stop_reader, self._stop = os.pipe()  # written by close(): no connection will come
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        answering = []
        while self._listener in select.select([self._listener, self._stop_reader], [], [])[0]:
            conn, _ = self._listener.accept()  # the instance's hello, then a device's
            answering.append(threading.Thread(target=self._answer_one, args=(conn,), daemon=True))
            answering[-1].start()
        for thread in answering:
            thread.join(60)

    def _answer_one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(60)
            hello = protocol.recv(conn).fields
            self.hello = self.hello or hello
            try:
                with open("/dev/null") as null:
                    fds = array.array("i", [null.fileno()] * self._fds)
                    conn.sendmsg([self._answer], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)] if self._fds else [])
                conn.recv(1)  # until the driver closes its end
            except OSError:  # it may close while this still writes: it read enough to refuse
                pass

    def close(self) -> None:
        """Stop listening, once the hello (if one came) was answered and its connection closed."""
        os.write(self._stop, b"x")
        self._thread.join(60)
        self._listener.close()
        os.close(self._stop)
        os.close(self._stop_reader)
