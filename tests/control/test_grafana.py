"""contrib/grafana/libshare.json: it parses, and every metric it queries is one a real arbiter exports."""

from __future__ import annotations

import json
import re

import numpy as np

import libshare

from tests.conftest import ROOT
from tests.control.test_metrics import _free_port, _scrape

DASHBOARD = ROOT / "contrib" / "grafana" / "libshare.json"
_METRIC = re.compile(r"\b(?:libshare|process)_[a-z_]+\b")


def _queries(node) -> list[str]:
    """Every PromQL text of the dashboard: panel targets' expr, template variables' queries."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                found.append(value)
            elif key == "query" and isinstance(value, str):
                found.append(value)
            else:
                found += _queries(value)
    elif isinstance(node, list):
        for item in node:
            found += _queries(item)
    return found


def test_dashboard_queries_only_metrics_the_arbiter_exports(dirs, foreground):
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels and all(p["targets"] for p in panels)
    queried = {name for query in _queries(dashboard) for name in _METRIC.findall(query)}
    assert {"libshare_server_state", "libshare_client_device_seconds_total", "libshare_client_memory_bytes",
            "libshare_client_dispatch_errors_total", "libshare_client_dispatches_completed_total"} <= queried

    port = _free_port()
    foreground("--metrics-port", str(port))
    with libshare.connect(name="grafana", group="g", mode="daemon", pipe_directory=dirs.pipe) as session:
        session.array(1024, np.float32)  # a client with a group: every per-client series exists now
        exported = {sample.name for samples in _scrape(port).values() for sample in samples}
    assert queried - exported == set(), f"the dashboard queries metrics no arbiter exports: {queried - exported}"
