"""The libshare demo: several processes share one device through one arbiter.

``python -m libshare.demo [--clients 5] [--seconds 5]`` starts one client
process per kernel (saxpy, vadd, sum, matmul, busy, then again), all at
once. Each dispatches its kernel over and over for the given time, checks the
result against numpy, and reports its dispatch rate and latency. When a
daemon answers at the pipe directory (``python -m libshare.arbiter``) the
clients use it; otherwise this process embeds the arbiter and serves it to
them on a private socket, the embedded default.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from libshare.protocol import paths as _config, wire as protocol
from libshare import connect, settings, workloads


def client_main(kernel: str, pipe_dir: str, seconds: float, seed: int) -> None:
    """One demo client: dispatch ``kernel`` for ``seconds``, check it, print a JSON report."""
    with connect(name=f"demo-{kernel}", mode="daemon", pipe_directory=pipe_dir) as session:
        job = workloads.prepare(kernel, session, np.random.default_rng(seed), {})
        latencies = []
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            sent = time.perf_counter()
            job.dispatch().wait(30)
            latencies.append(time.perf_counter() - sent)
        elapsed = time.perf_counter() - started
        job.check()
        print(json.dumps({"kernel": kernel, "pid": os.getpid(), "dispatches": len(latencies),
                          "rate": len(latencies) / elapsed,
                          "p50_us": float(np.percentile(latencies, 50) * 1e6),
                          "p99_us": float(np.percentile(latencies, 99) * 1e6), "checked": True}))


def _progress(fraction: float, label: str) -> None:
    width = 30
    filled = int(width * min(fraction, 1.0))
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {fraction * 100:5.1f}% {label}")
    sys.stderr.flush()


def _start_clients(count: int, pipe_dir: Path, seconds: float) -> list[subprocess.Popen]:
    kernels = list(workloads.WORKLOADS)
    return [subprocess.Popen([sys.executable, "-m", "libshare.demo", "--client", kernels[i % len(kernels)],
                              "--pipe-directory", str(pipe_dir), "--seconds", str(seconds), "--seed", str(i)],
                             stdout=subprocess.PIPE, text=True)
            for i in range(count)]


def _collect(clients: list[subprocess.Popen], seconds: float) -> list[dict]:
    started = time.monotonic()
    while any(c.poll() is None for c in clients):  # (the clients start, then run for ``seconds``)
        fraction = (time.monotonic() - started) / (seconds + 1)
        running = sum(c.poll() is None for c in clients)
        _progress(min(fraction, 0.99), f"{running} clients running" if fraction < 1 else
                  f"{running} clients finishing (started late: a busy machine)")
        time.sleep(0.1)
    _progress(1.0, "done" + " " * 20)
    sys.stderr.write("\n")
    reports = []
    for client in clients:
        out = client.stdout.read()
        client.stdout.close()
        if client.returncode != 0 or not out.strip():
            raise SystemExit(f"client pid {client.pid} failed (exit {client.returncode})")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def _table(reports: list[dict], where: str) -> str:
    lines = [f"{len(reports)} client processes sharing one device ({where}); every result checked against numpy",
             f"{'pid':>8} {'kernel':<8} {'dispatches':>10} {'disp/s':>9} {'p50 us':>9} {'p99 us':>9}"]
    for r in reports:
        lines.append(f"{r['pid']:>8} {r['kernel']:<8} {r['dispatches']:>10} {r['rate']:>9.0f} "
                     f"{r['p50_us']:>9.0f} {r['p99_us']:>9.0f}")
    lines.append(f"{'total':>8} {'':<8} {sum(r['dispatches'] for r in reports):>10} "
                 f"{sum(r['rate'] for r in reports):>9.0f}")
    return "\n".join(lines)


def run_demo(clients: int, seconds: float, pipe_directory: str | None = None) -> str:
    """Run the demo and return its table (uses a daemon when one answers)."""
    daemon_dir = _config.pipe_directory(pipe_directory)
    probe = protocol.dial(_config.socket_path(daemon_dir), 2.0)
    if probe is not None:
        probe.close()
        return _table(_collect(_start_clients(clients, daemon_dir, seconds), seconds), f"daemon at {daemon_dir}")
    from libshare.arbiter import Arbiter

    with tempfile.TemporaryDirectory(prefix="libshare-demo-") as private:
        arbiter = Arbiter(max_clients=max(clients, settings.default("max_clients")))
        try:
            arbiter.serve(_config.socket_path(Path(private)))
            reports = _collect(_start_clients(clients, Path(private), seconds), seconds)
        finally:
            arbiter.close()
    return _table(reports, f"arbiter embedded in pid {os.getpid()}")


def main(argv: list[str] | None = None) -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description="several processes sharing one device through libshare")
    parser.add_argument("--clients", type=int, default=5, help="client processes (at least 4 recommended)")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each client dispatches")
    parser.add_argument("--pipe-directory", default=None)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        client_main(args.client, args.pipe_directory, args.seconds, args.seed)
        return
    if args.clients < 1:
        parser.error("--clients must be at least 1")
    print(run_demo(args.clients, args.seconds, args.pipe_directory))


if __name__ == "__main__":
    main()
