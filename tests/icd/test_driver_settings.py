"""The driver reads the session's settings as libshare.connect() does (libshare/settings.py).

Its hello is caught by a listener (tests/icd/_broken.py) that refuses it: each LIBSHARE_DEVICE_MEM_LIMIT
that settings.py's parse_device_limits reads must reach the hello as the same byte counts, and each it
refuses must stop the driver before it dials, with the variable named (the driver refuses more than
18 decimals, which settings.py would read); the name, group, priority and
share travel as they are set.
"""

from __future__ import annotations

import json
import sys

import pytest

from libshare.errors import InvalidSubmission
from libshare.icd import manifest_path
from libshare.settings import configured

from tests.icd._broken import BrokenArbiter, frame
from tests.icd.conftest import PROBE, environment, probe

REFUSAL = frame(json.dumps({"ok": False, "error": "AccessDenied", "message": "refused by the test"}).encode())
LIMITS = ["96M", "1.5G", "512MiB", "2gb", " 7K ", "4096", "4096B", "1.25 t", "0=1G,UUID-AB=512M", " Ab-c = 3M,2=1",
          "1152921504606846975", "0.000000000000000001G",
          "unlimited", "none", "1e3", "1.", ".5G", "-1G", "1X", "1GiBB", "1Gi", "1G,,2G", "", ",", "0=", "=1G",
          "1152921504606846977", "k" * 70 + "=1G", "   ", "1.0000000000000000001G"]
DRIVER_REFUSES = {"1.0000000000000000001G"}
"""What settings.py reads but the driver refuses: a size with more than 18 decimals."""


def hello_for(tmp_path, **env: str) -> tuple[dict | None, str]:
    """The hello the driver sends in this environment (None if it sent none), and its stderr."""
    arbiter = BrokenArbiter(tmp_path / "pipe", REFUSAL, 0)
    try:
        seen = probe([sys.executable, str(PROBE)], environment(tmp_path / "pipe", **env))
    finally:
        arbiter.close()
    assert seen["error"] == "VkErrorIncompatibleDriver"
    return arbiter.hello, seen["stderr"]


def driver() -> dict[str, str]:
    """The loader pointed at libshare's driver alone, as libshare-run points it."""
    return {"VK_DRIVER_FILES": str(manifest_path())}


@pytest.mark.parametrize("text", LIMITS)
def test_the_memory_limit_is_read_as_connect_reads_it(tmp_path, text):
    try:  # as connect() reads it (None: unset)
        wanted = configured("device_mem_limit", {"LIBSHARE_DEVICE_MEM_LIMIT": text})
    except InvalidSubmission:
        wanted = False
    hello, stderr = hello_for(tmp_path, LIBSHARE_DEVICE_MEM_LIMIT=text, **driver())
    if wanted is False or text in DRIVER_REFUSES or (wanted and (len(wanted) > 16 or max(map(len, wanted)) > 64)):
        assert hello is None and "LIBSHARE_DEVICE_MEM_LIMIT" in stderr  # refused before it dialled
    elif wanted is None:
        assert hello is not None and "mem_limit" not in hello, stderr
    else:
        assert hello is not None and hello["mem_limit"] == wanted, stderr


def test_the_session_options_travel_as_they_are_set(tmp_path):
    hello, _ = hello_for(tmp_path, LIBSHARE_CLIENT_NAME="trainer", LIBSHARE_GROUP="batch",
                         LIBSHARE_CLIENT_PRIORITY="low", LIBSHARE_ACTIVE_THREAD_PERCENTAGE="40", **driver())
    assert hello == {"op": "hello", "name": "trainer", "version": 1, "device_info": True, "group": "batch",
                     "priority": "low", "share": "40"}
