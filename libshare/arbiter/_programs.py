"""Programs shared by content: one reflection and one pipeline per distinct SPIR-V module.

Clients that load the same SPIR-V (the usual case: many processes of one job) share
the arbiter's VkPipeline. Each client still gets its own ProgramRecord and program id,
so freeing a program, or losing a client, never touches another client's. A shared
pipeline is destroyed when the last record using it is destroyed, that is once the
last command that names it has retired.

Reflection results are kept for the most recent ``_INTERFACES`` modules, keyed by
SHA-256, so a client that loads many distinct modules cannot make the cache grow.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

from .._spirv import ShaderInterface, reflect
from .device import Device, Pipeline

_INTERFACES = 256  # reflected modules remembered


class Interfaces:
    """SPIR-V reflection by content, for the connection threads (thread-safe)."""

    def __init__(self) -> None:
        self._known: OrderedDict[bytes, ShaderInterface] = OrderedDict()
        self._lock = threading.Lock()

    def of(self, spirv: bytes) -> tuple[bytes, ShaderInterface]:
        """The module's digest and interface; raises what :func:`reflect` raises on bad SPIR-V."""
        digest = hashlib.sha256(spirv).digest()
        with self._lock:
            found = self._known.get(digest)
            if found is not None:
                self._known.move_to_end(digest)
                return digest, found
        interface = reflect(spirv)  # outside the lock: a large module must not stall other clients
        with self._lock:
            self._known[digest] = interface
            if len(self._known) > _INTERFACES:
                self._known.popitem(last=False)
        return digest, interface


class SharedPipelines:
    """Pipelines by module digest, counted by the records that use them (drain thread only)."""

    def __init__(self) -> None:
        self._by_digest: dict[bytes, Pipeline] = {}
        self._users: dict[Pipeline, tuple[bytes, int]] = {}

    def acquire(self, device: Device, digest: bytes, spirv: bytes, bindings: int, push_size: int,
                entry: str) -> Pipeline:
        """The pipeline of ``spirv``, created on first use; call :meth:`release` once per acquire."""
        pipeline = self._by_digest.get(digest)
        if pipeline is None:
            pipeline = device.create_pipeline(spirv, bindings, push_size, entry)
            self._by_digest[digest] = pipeline
            self._users[pipeline] = (digest, 0)
        digest, users = self._users[pipeline]
        self._users[pipeline] = (digest, users + 1)
        return pipeline

    def release(self, device: Device, pipeline: Pipeline) -> None:
        """One user fewer; the last one destroys the pipeline."""
        digest, users = self._users[pipeline]
        if users > 1:
            self._users[pipeline] = (digest, users - 1)
            return
        del self._users[pipeline], self._by_digest[digest]
        device.destroy_pipeline(pipeline)

    def forget(self) -> None:
        """Drop every pipeline without destroying it (its device is being closed and recreated)."""
        self._by_digest.clear()
        self._users.clear()

    def __len__(self) -> int:
        return len(self._by_digest)
