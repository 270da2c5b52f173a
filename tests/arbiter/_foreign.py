"""A stdlib-only peer for the access-control tests, run under another uid with the system python.

``python3 _foreign.py SOCKET OP [ARGS...]``: OP is ``hello`` (a session's first frame) or a
control command. Prints the reply's error class, or ``ok``. It repeats the 16-byte frame
header of libshare/protocol/wire.py because libshare itself cannot be imported there.
"""

import json
import socket
import struct
import sys

HEADER = struct.Struct("<IHHII")
MAGIC, VERSION = 0x4C534354, 1


def exchange(path: str, fields: dict) -> dict:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    body = json.dumps(fields).encode()
    sock.sendall(HEADER.pack(MAGIC, VERSION, 0, len(body), 0) + body)
    header = b""
    while len(header) < HEADER.size:
        header += sock.recv(HEADER.size - len(header))
    _, _, _, json_length, payload_length = HEADER.unpack(header)
    rest = b""
    while len(rest) < json_length + payload_length:
        rest += sock.recv(json_length + payload_length - len(rest))
    return json.loads(rest[:json_length])


if __name__ == "__main__":
    path, op, *args = sys.argv[1:]
    request = {"op": "hello", "name": "foreign", "version": 1} if op == "hello" else \
        {"op": "control", "command": op, "args": args}
    reply = exchange(path, request)
    print("ok" if reply.get("ok") else reply.get("error"), flush=True)
