"""Hostile descriptors: every one gets exactly one answer, and no one else notices."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from libshare.ring import C

from tests.conftest import ROOT
from tests.arbiter.conftest import start_client

_SEED = int(os.environ.get("LIBSHARE_FUZZ_SEED", "20261122"))
_COUNT = 100_000
_KNOWN = {0} | {-code for code in (C.EBADSLOT, C.ENOPROGRAM, C.ENOBUFFER, C.EBINDINGS, C.ERANGE, C.EGROUPS,
                                   C.EPUSH, C.EUNSUPPORTED)}


def test_a_hundred_thousand_hostile_descriptors_beside_an_honest_client(daemon):
    process, pipe_dir = daemon
    honest = start_client("mixed", pipe_dir, 7, 40)
    fuzzer = subprocess.run([sys.executable, "-m", "tests.arbiter._descriptor_fuzz", str(pipe_dir), str(_SEED),
                             str(_COUNT)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert fuzzer.returncode == 0, f"seed {_SEED}: {fuzzer.stderr[-3000:]}"
    tally = json.loads(fuzzer.stdout)
    assert tally["pushed"] == _COUNT, f"seed {_SEED}: {tally}"
    assert (tally["answered"], tally["twice"], tally["unknown"], tally["missing"]) == (_COUNT, 0, 0, 0), \
        f"seed {_SEED}: every descriptor answered exactly once: {tally}"
    statuses = {int(status) for status in tally["statuses"]}
    assert statuses <= _KNOWN, f"seed {_SEED}: statuses outside the documented ones: {tally['statuses']}"
    assert tally["statuses"].get("0", 0) > 0 and len(statuses) > 3, f"the fuzz reached too little: {tally}"
    assert tally["group_ok"] > 0, f"seed {_SEED}: no dispatch through the bind group ran: {tally}"
    assert tally["stamp_ok"] > 0, f"seed {_SEED}: no timestamp ran: {tally}"
    out, _ = honest.communicate(timeout=600)
    assert honest.returncode == 0 and out.strip() == "ok", out
    assert process.poll() is None
    log = (pipe_dir / "server.log").read_text()
    assert "Traceback" not in log and "error" not in log.lower().replace("errors", ""), log[-3000:]
