"""Draw benchmark runs (the JSON files bench/conftest.py writes) as one picture.

    python -m bench.plot bench/results/*.json -o docs/benchmarks.png

One panel per figure: for each device (lavapipe, a GPU) a point at the median over blocks, its
range (min-max) as an error bar, green where the median meets the target and red where it does
not (grey without a target), and the target as a dashed line (a band for a range). Runs of the
same device kind are merged, a later run's figure replacing an earlier one's of the same name,
so partial runs add up. Only figures with a target are drawn unless ``--all`` is given; ``--match``
keeps those whose name contains a word. ``--table`` prints the figures as a Markdown table instead
(median, range, target and whether the median meets it, per device), as docs/benchmarks.md has it.

Needs matplotlib (the ``[bench]`` extra).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from bench._compare import Target, fmt, with_unit

COLUMNS = 4
MET, MISSED, NONE = "#2a8a3e", "#c0392b", "#555555"


def load(paths: list[Path]) -> dict[str, dict]:
    """Runs merged by device kind: {kind: {"device": name, "started": [...], "figures": {name: figure}}}."""
    runs = sorted((json.loads(p.read_text()) for p in paths), key=lambda r: r.get("started") or "")
    devices: dict[str, dict] = {}
    for run in runs:
        kind = run.get("device_kind") or "unknown"
        merged = devices.setdefault(kind, {"device": run.get("device"), "started": [], "figures": {},
                                           "cores": run.get("cores")})
        merged["started"].append(run.get("started"))
        for figure in run["figures"]:
            merged["figures"][figure["name"]] = figure
    # lavapipe first, then the others by name
    return dict(sorted(devices.items(), key=lambda kv: (kv[0] != "lavapipe", kv[0])))


def chosen(devices: dict[str, dict], everything: bool, words: list[str]) -> list[str]:
    """Figure names in the order they were first recorded, those with a target unless ``everything``."""
    names: list[str] = []
    for merged in devices.values():
        for name, figure in merged["figures"].items():
            if name in names:
                continue
            if not everything and not figure.get("target"):
                continue
            if words and not any(w.lower() in name.lower() for w in words):
                continue
            names.append(name)
    return names


def draw_target(ax, target: dict) -> None:
    style = {"color": "#1f4e9c", "linestyle": "--", "linewidth": 1.2}
    if target["op"] == "within":
        ax.axhspan(target["value"], target["high"], color="#1f4e9c", alpha=0.08)
        ax.axhline(target["value"], **style)
        ax.axhline(target["high"], **style)
    else:
        ax.axhline(target["value"], **style)


def compact(value: float, unit: str = "") -> str:
    """A tick or a label: 4.58M, 45.2k, else as the summary prints it."""
    size = abs(value)
    if size >= 1e6:
        return f"{value / 1e6:.3g}M"
    if size >= 1e4:
        return f"{value / 1e3:.3g}k"
    return fmt(value, unit)


def panel(ax, name: str, devices: dict[str, dict]) -> None:
    from matplotlib.ticker import FuncFormatter

    kinds = list(devices)
    unit, target, top = "", None, 0.0
    for i, kind in enumerate(kinds):
        figure = devices[kind]["figures"].get(name)
        if figure is None:
            continue
        unit, target = figure["unit"], figure.get("target") or target
        met = None if not figure.get("target") else Target(**figure["target"]).met(figure["median"])
        color = NONE if met is None else MET if met else MISSED
        ax.errorbar([i], [figure["median"]], yerr=[[figure["median"] - figure["min"]],
                                                   [figure["max"] - figure["median"]]],
                    fmt="o", color=color, ecolor=color, elinewidth=2, capsize=5, markersize=6)
        top = max(top, figure["max"])
        ax.annotate(compact(figure["median"], unit), (i, figure["median"]), textcoords="offset points", xytext=(8, -3),
                    fontsize=7, color=color)
    if target:
        draw_target(ax, target)
        top = max(top, target.get("high") or target["value"])
    ax.set_xlim(-0.6, len(kinds) - 0.4)
    ax.set_xticks(range(len(kinds)))
    ax.set_xticklabels(kinds, fontsize=7)
    ax.set_ylabel({"x": "ratio", "": "value"}.get(unit, unit), fontsize=7)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_ylim(0, top * 1.15 if top > 0 else 1)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: compact(v) if abs(v) >= 1e4 else f"{v:g}"))
    ax.grid(axis="y", alpha=0.3)
    ax.set_title("\n".join(textwrap.wrap(name, 44)), fontsize=7.5)


def cell(figure: dict | None) -> str:
    if figure is None:
        return ""
    unit = figure["unit"]
    text = f"{with_unit(figure['median'], unit)} ({fmt(figure['min'], unit)}-{fmt(figure['max'], unit)})"
    if figure.get("target"):
        met = Target(**figure["target"]).met(figure["median"])
        text += "" if met else " **missed**"
    return text


def table(devices: dict[str, dict], names: list[str]) -> str:
    """A Markdown table: figure, target, and per device the median (range over blocks)."""
    kinds = list(devices)
    lines = ["| figure | target | " + " | ".join(f"{k}: median (range)" for k in kinds) + " |",
             "| --- | --- | " + " | ".join("---" for _ in kinds) + " |"]
    for name in names:
        figures = [devices[k]["figures"].get(name) for k in kinds]
        first = next(f for f in figures if f is not None)
        target = Target(**first["target"]).text(first["unit"]) if first.get("target") else ""
        lines.append(f"| {name} | {target} | " + " | ".join(cell(f) for f in figures) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="JSON files written by a bench run")
    parser.add_argument("-o", "--output", type=Path, default=Path("docs/benchmarks.png"))
    parser.add_argument("--all", action="store_true", help="draw the figures without a target too")
    parser.add_argument("--match", action="append", default=[], metavar="WORD",
                        help="only figures whose name contains WORD (repeatable)")
    parser.add_argument("--table", action="store_true", help="print a Markdown table instead of drawing")
    parser.add_argument("--dpi", type=int, default=110)
    args = parser.parse_args(argv)
    if args.table:
        devices = load(args.runs)
        print(table(devices, chosen(devices, args.all, args.match)))
        return 0

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = load(args.runs)
    names = chosen(devices, args.all, args.match)
    if not names:
        print("no figures to draw", file=sys.stderr)
        return 1
    rows = -(-len(names) // COLUMNS)
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(COLUMNS * 3.7, rows * 2.45 + 0.9), squeeze=False)
    for ax, name in zip(axes.flat, names):
        panel(ax, name, devices)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    runs = "; ".join(f"{kind}: {merged['device']} ({', '.join(s[:10] for s in merged['started'] if s)})"
                     for kind, merged in devices.items())
    fig.suptitle("libshare benchmarks: median over blocks (dot), range min-max (bar), target (dashed); "
                 "green met, red missed\n" + "\n".join(textwrap.wrap(runs, 150)), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / (rows * 2.45 + 0.9)))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=args.dpi)
    print(f"{len(names)} figures from {len(args.runs)} runs drawn to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
