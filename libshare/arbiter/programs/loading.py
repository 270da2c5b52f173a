"""Programs: admission by content, pipelines shared by content, compiled off the control thread.

A client's ``load_program`` runs on its connection thread, in three steps:

1. **Admission** (:class:`Interfaces`): the specialization constants frozen into the module
   (``specialize.py``), then bounds, reflection, whitelist, device limits and the SPIR-V
   validator (``admission.py``) on that specialized module (its runtime arrays of buffers sized
   first, ``arrays.py``). The outcome, admitted (with the
   specialized module) or refused, is kept for the most recent ``_INTERFACES`` modules by
   SHA-256 of the module, its constants and its array lengths, so a module many clients load is checked once,
   and a refused one is refused again at once, whoever sends it.
2. **Compilation** (:class:`SharedPipelines`): clients that load the same SPIR-V with the
   same constants and array lengths (the usual case: many processes of one job) share the
   arbiter's VkPipeline, keyed by the SHA-256 of the specialized module: other constants or
   lengths, another module, another pipeline. A module the
   arbiter has no pipeline for is compiled first in a vetting child (daemon arbiters,
   ``_compiler.py``: a crash or a compile past the time limit refuses the module and
   remembers the refusal), then by the arbiter itself, on the connection thread, never
   on the control thread: a slow compile delays only the client that asked for it.
3. **Registration**, as a control task: the quota check that counts, and the client's
   ProgramRecord. Each client gets its own record and program id, so freeing a program,
   or losing a client, never touches another client's. A shared pipeline outlives the last
   record using it (once the last command that names it has retired) as one of the
   ``_IDLE_PIPELINES`` most recently left idle, and the oldest idle one is destroyed past that:
   a program that makes and destroys its pipelines at every step (wgpu does) loads them again
   without a vetting compile or a driver compile, neither of which is cheap, and without
   lavapipe's 105 KiB never given back per compile (below).

**Quotas.** Every pipeline costs the arbiter memory, and lavapipe never gives back about
105 KiB of each pipeline it compiles. A client may hold at most ``max_programs`` programs
(:data:`MAX_PROGRAMS`, ``LIBSHARE_MAX_PROGRAMS``) and all clients together
:data:`MAX_TOTAL_PROGRAMS`; past either, ``QuotaExceeded``. Loading a module another
client already loaded costs a record, not a compile, so honest clients that share
kernels do not feel the cap. What the caps do not bound is churn: a client that loads
and frees distinct modules for ever still costs lavapipe's 105 KiB per compile.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import NamedTuple

from libshare.arbiter.programs.spirv import ShaderInterface
from libshare.errors import InvalidSubmission, QuotaExceeded, ServerNotReady
from libshare.arbiter.programs.admission import admit
from libshare.arbiter.programs.arrays import arrays_key
from libshare.arbiter.programs.nonsemantic import without_nonsemantic
from libshare.arbiter.programs.specialize import constants_key, specialize
from libshare.arbiter.serve.clients import ProgramRecord
from libshare.arbiter.device import Device, Pipeline

__all__ = ["Admitted", "Interfaces", "MAX_PROGRAMS", "MAX_TOTAL_PROGRAMS", "SharedPipelines", "check_program_quota"]

_INTERFACES = 256  # admission outcomes remembered
_IDLE_PIPELINES = 64  # pipelines kept once no record uses them (the most recently left idle)
_SPECIALIZED_BYTES = 32 << 20  # most bytes of specialized modules remembered with them
MAX_PROGRAMS = 256
"""Default most programs one client may hold at once."""
MAX_TOTAL_PROGRAMS = 4096
"""Most programs all clients together may hold at once."""


class Admitted(NamedTuple):
    """A module admission accepted: what loading it needs."""

    digest: bytes
    """SHA-256 of the specialized module: its pipeline's key, and the quarantine's."""
    interface: ShaderInterface
    """Its interface, reflected from the specialized module."""
    module: bytes
    """The specialized module (the module itself when it declares no specialization constant)."""
    key: bytes
    """SHA-256 of the module as sent and its constants: the admission cache's key."""


class Interfaces:
    """Admission outcomes by content (module and constants), for the connection threads (thread-safe)."""

    def __init__(self) -> None:
        self._known: OrderedDict[bytes, Admitted | InvalidSubmission] = OrderedDict()
        self._bytes = 0  # of the specialized modules kept that are not the module as sent
        self._lock = threading.Lock()

    def of(self, spirv: bytes, device: Device, constants=(), arrays=()) -> Admitted:
        """The module specialized with ``constants`` (``[id, value]`` pairs) and ``arrays`` (``[set,
        binding, length]`` triples: its runtime arrays' lengths) and its interface; raises
        InvalidSubmission when it is refused."""
        spirv = bytes(spirv)
        extra = constants_key(constants) + (b"\0arrays:" + arrays_key(arrays) if arrays else b"")
        key = hashlib.sha256(spirv + b"\0constants:" + extra if extra else spirv).digest()
        with self._lock:
            found = self._known.get(key)
            if found is not None:
                self._known.move_to_end(key)
        if found is None:
            try:  # outside the lock: a large module must not stall other clients
                module = specialize(spirv, constants, arrays)
                if "VK_KHR_shader_non_semantic_info" not in device.features:
                    module = without_nonsemantic(module)  # (admitted as the device will take it)
                found = Admitted(hashlib.sha256(module).digest(), admit(module, device), module, key)
            except InvalidSubmission as exc:
                found = exc
            self._remember(key, found)
        if isinstance(found, InvalidSubmission):
            raise InvalidSubmission(str(found))
        return found if found.module is not None else found._replace(module=spirv)

    def refuse(self, key: bytes, refusal: InvalidSubmission) -> None:
        """Remember that a module was refused after admission (its compile crashed or ran too long)."""
        self._remember(key, refusal)

    def _remember(self, key: bytes, outcome: Admitted | InvalidSubmission) -> None:
        if isinstance(outcome, Admitted) and outcome.digest == key:  # the module as sent: of() has it at hand
            outcome = outcome._replace(module=None)
        with self._lock:
            self._drop(key)
            self._known[key] = outcome
            self._bytes += self._size(outcome)
            while len(self._known) > _INTERFACES or self._bytes > _SPECIALIZED_BYTES:
                self._drop(next(iter(self._known)))

    def _drop(self, key: bytes) -> None:
        outcome = self._known.pop(key, None)
        self._bytes -= self._size(outcome)

    @staticmethod
    def _size(outcome) -> int:
        return len(outcome.module) if isinstance(outcome, Admitted) and outcome.module is not None else 0


class SharedPipelines:
    """Pipelines by module digest, counted by the records that use them; the most recent idle ones
    (no record uses them) kept, up to ``_IDLE_PIPELINES``.

    :meth:`acquire` may run on any thread; :meth:`release`, :meth:`collect` and
    :meth:`forget` run on the control thread.
    """

    def __init__(self) -> None:
        self._by_digest: dict[bytes, Pipeline] = {}  # in use and idle
        self._users: dict[Pipeline, tuple[bytes, int]] = {}  # 0 users: idle
        self._idle: OrderedDict[bytes, None] = OrderedDict()  # the idle ones' digests, oldest first
        self._duplicates: list[Pipeline] = []  # compiled twice by racing loads: destroy on the control thread
        self._generation = 0  # bumped when the device is recreated
        self._lock = threading.Lock()

    def acquire(self, device: Device, digest: bytes, spirv: bytes, interface: ShaderInterface,
                push_size: int) -> Pipeline:
        """The pipeline of ``spirv``, compiled on the calling thread on first use.

        Call :meth:`release` once per acquire, on the control thread.
        """
        bindings = len(interface.bindings)
        with self._lock:
            generation = self._generation
            if (shared := self._add_user(digest)) is not None:
                return shared
        pipeline = device.create_pipeline(spirv, bindings, push_size, interface.entry_point)
        with self._lock:
            if generation != self._generation:
                raise ServerNotReady("the device was recreated while the program compiled; load it again")
            if (shared := self._add_user(digest)) is not None:
                self._duplicates.append(pipeline)
                return shared
            self._by_digest[digest] = pipeline
            self._users[pipeline] = (digest, 1)
        return pipeline

    def has(self, digest: bytes) -> bool:
        """Whether a pipeline of this module exists, in use or idle (its module needs no vetting)."""
        with self._lock:
            return digest in self._by_digest

    def digest_of(self, pipeline: Pipeline) -> bytes | None:
        """The SHA-256 of the module ``pipeline`` was compiled from (None: not one of this device's)."""
        with self._lock:
            known = self._users.get(pipeline)
        return known[0] if known else None

    def _add_user(self, digest: bytes) -> Pipeline | None:
        pipeline = self._by_digest.get(digest)
        if pipeline is not None:
            known, users = self._users[pipeline]
            self._users[pipeline] = (known, users + 1)
            self._idle.pop(digest, None)
        return pipeline

    def release(self, device: Device, pipeline: Pipeline) -> None:
        """One user fewer; the last one leaves the pipeline idle, which destroys the oldest idle one
        past ``_IDLE_PIPELINES`` (control thread)."""
        with self._lock:
            if pipeline not in self._users:  # made by a device recreated since: gone with it
                return
            digest, users = self._users[pipeline]
            self._users[pipeline] = (digest, users - 1)
            if users > 1:
                return
            self._idle[digest] = None
            evicted = []
            while len(self._idle) > _IDLE_PIPELINES:
                oldest, _ = self._idle.popitem(last=False)
                evicted.append(self._by_digest.pop(oldest))
                del self._users[evicted[-1]]
        for old in evicted:
            device.destroy_pipeline(old)

    def collect(self, device: Device) -> None:
        """Destroy the pipelines that racing loads compiled twice (control thread)."""
        with self._lock:
            duplicates, self._duplicates = self._duplicates, []
        for pipeline in duplicates:
            device.destroy_pipeline(pipeline)

    def forget(self) -> None:
        """Drop every pipeline without destroying it (its device is being closed and recreated)."""
        with self._lock:
            self._by_digest.clear()
            self._users.clear()
            self._idle.clear()
            self._duplicates.clear()
            self._generation += 1

    def idle(self) -> int:
        """How many pipelines no record uses are kept."""
        with self._lock:
            return len(self._idle)

    def __len__(self) -> int:
        """How many pipelines records use."""
        with self._lock:
            return len(self._by_digest) - len(self._idle)


def check_program_quota(client, clients, per_client: int) -> None:
    """Raise QuotaExceeded when ``client`` may not hold one more program."""
    held = client.held(ProgramRecord)
    if held >= per_client:
        raise QuotaExceeded(f"{client.describe()} holds {held} programs (freed ones still in use count), its "
                            f"limit (LIBSHARE_MAX_PROGRAMS={per_client}); free some first")
    total = sum(other.held(ProgramRecord) for other in clients)
    if total >= MAX_TOTAL_PROGRAMS:
        raise QuotaExceeded(f"the arbiter holds {total} programs for all clients, its limit "
                            f"({MAX_TOTAL_PROGRAMS}); retry once others have freed theirs")
