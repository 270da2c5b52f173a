"""A pod's process for the device plugin's tests and tools/attack_k8s.py: a container's environment,
its share directory as its pipe directory, streaming checked dispatches.

It runs ``tests/arbiter/_streaming_client.py`` (a wrong result, or a session lost, ends it with
status 1) with the LIBSHARE_* environment the plugin allocated and, for the pipe directory, the
share directory the plugin mounts there (no mount namespace here: the host's path). It imports
only what every tree's ``tests`` has had since the plugin: the attack tool loads it by path
beside the tree it measures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from tests.arbiter.test_reattach import Client
from tests.conftest import stop_process


class Pod(Client):
    """One container's process; ``events`` are the streaming client's JSON lines, as they come."""

    def __init__(self, response, log_path: Path, root: Path):  # (not Client's: an environment, a log)
        self.group = response.envs["LIBSHARE_GROUP"]
        share = response.mounts[0].host_path
        env = {"PATH": "/usr/bin:/bin", **dict(response.envs), "LIBSHARE_PIPE_DIRECTORY": share}
        if "PYTHONPATH" in os.environ:
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        self.log_path = log_path
        with open(log_path, "w") as stderr:
            self.process = subprocess.Popen([sys.executable, "-m", "tests.arbiter._streaming_client", share, "2"],
                                            cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=stderr, text=True)
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def served_at(self, arbiter: int) -> float | None:
        """When (``time.monotonic()``) its first dispatch on ``arbiter`` succeeded; None if none has."""
        return next((e["t"] for e in self.events if e["event"] == "ok" and e["arbiter"] == arbiter), None)

    def ended(self) -> bool:
        """Whether its process has exited."""
        return self.process.poll() is not None

    def why(self) -> str:
        """Its exit status and the end of its standard error."""
        return f"status {self.process.returncode}: {self.log_path.read_text()[-1500:]}"

    def stop(self) -> None:
        """End it, whatever state it is in."""
        if not self.process.stdin.closed:
            self.process.stdin.close()
        stop_process(self.process)
        self._reader.join(10)
