"""What a search writes: the report (JSON and a terminal table), the frontier plot, the files.

Every output is written to a hidden temporary file beside its target (`onnxq._output`) and
all of them are renamed into place only once all are complete, so a failed or interrupted
run leaves none of them.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from onnxq import _output
from onnxq.tuning.budget import Budget
from onnxq.tuning.layers import Layer, bits_of
from onnxq.tuning.search import SearchResult, cheapest_single

__all__ = ["build_report", "output_paths", "plot_png", "table_text", "write_all"]


def output_paths(output: Path) -> dict[str, Path]:
    """The files a search writes beside ``output`` (the model): recipe, report, plot."""
    stem = output.name[: -len(".onnx")] if output.name.endswith(".onnx") else output.name
    folder = output.parent
    return {
        "model": output,
        "recipe": folder / f"{stem}.recipe.yaml",
        "report": folder / f"{stem}.tune.json",
        "plot": folder / f"{stem}.frontier.png",
    }


def _num(value: float | None) -> Any:
    if value is None:
        return None
    return value if math.isfinite(value) else repr(float(value))


def build_report(
    *,
    budget: Budget,
    layers: Sequence[Layer],
    untuned: Sequence[str],
    candidates: Sequence[str],
    result: SearchResult,
    final: Mapping[str, float],
    counts: Mapping[str, int],
    settings: Mapping[str, Any],
) -> dict[str, Any]:
    """The JSON report of a search."""
    rows = []
    for layer in layers:
        fmt = result.assignment[layer.name]
        rows.append(
            {
                "layer": layer.name,
                "nodes": list(layer.nodes),
                "weights": layer.size,
                "format": fmt,
                "bits": bits_of(fmt),
                "sensitivity": {c: _num(v) for c, v in result.sensitivity[layer.name].items()},
            }
        )
    single = cheapest_single(budget, result.uniform.values())
    return {
        "budget": budget.text,
        "metric": budget.name,
        "candidates": list(candidates),
        "bits_per_weight": result.bits,
        "weights_tuned": sum(layer.size for layer in layers),
        "untuned_nodes": list(untuned),
        "search": {"metric": _num(final["search"]), "samples": counts["search"]},
        "held_out": {"metric": _num(final["held_out"]), "samples": counts["held_out"]},
        "held_out_note": (
            "the held-out samples were not used by the sensitivity trials nor the path search; "
            f"{result.repairs} repair(s) were made because the choice missed the budget on "
            "them" + (" (so they took part in the final choice)" if result.repairs else "")
        ),
        "cheapest_single_format": None
        if single is None
        else {
            "format": single.label,
            "bits_per_weight": single.bits,
            "search": _num(single.search),
            "held_out": _num(single.held_out),
        },
        "layers": rows,
        "frontier": [
            {
                "kind": p.kind,
                "bits_per_weight": p.bits,
                "search": _num(p.search),
                "held_out": _num(p.held_out),
                "predicted": _num(p.predicted),
                **({"format": p.label} if p.label else {}),
            }
            for p in result.points
        ],
        "trials": {"run": result.trials_run, "from_cache": result.trials_cached},
        "repairs": result.repairs,
        **settings,
    }


def _short(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return f"{value:.6g}"


def table_text(report: Mapping[str, Any]) -> str:
    """The report as a terminal table and a few summary lines."""
    metric = report["metric"]
    rows = [["layer", "weights", "format", "bits", f"{metric} alone"]]
    for r in report["layers"]:
        alone = r["sensitivity"].get(r["format"])
        rows.append([r["layer"], str(r["weights"]), r["format"], f"{r['bits']:g}", _short(alone)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    single = report["cheapest_single_format"]
    single_text = (
        f"{single['format']} at {single['bits_per_weight']:g}" if single else "none of them"
    )
    lines += [
        "",
        f"bits per weight: {report['bits_per_weight']:.3f} (cheapest single format meeting "
        f"{report['budget']}: {single_text})",
        f"{metric}: {_short(report['search']['metric'])} on {report['search']['samples']} search "
        f"inputs, {_short(report['held_out']['metric'])} on {report['held_out']['samples']} "
        "held-out inputs (not seen by the search"
        + (f"; {report['repairs']} repairs for them)" if report.get("repairs") else ")"),
        f"trials: {report['trials']['run']} run, {report['trials']['from_cache']} from the cache; "
        f"{report['runner']}; {report['seconds']:.1f} s",
    ]
    if report["untuned_nodes"]:
        lines.append(f"left float (unnamed nodes): {', '.join(report['untuned_nodes'][:5])}")
    return "\n".join(lines)


def plot_png(report: Mapping[str, Any]) -> bytes:
    """The explored frontier (bits per weight against the metric) as a PNG.

    Raises:
        ValueError: matplotlib is not installed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install matplotlib") from None
    fig = Figure(figsize=(6.4, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    styles = {"uniform": "s", "path": "o", "rejected": "x", "chosen": "*"}

    def value(v: Any) -> float:
        return float(v) if v is not None else math.nan

    for kind, marker in styles.items():
        pts = [p for p in report["frontier"] if p["kind"] == kind]
        if pts:
            xs = [p["bits_per_weight"] for p in pts]
            ax.scatter(xs, [value(p["search"]) for p in pts], marker=marker, label=kind)
    chosen = [p for p in report["frontier"] if p["kind"] == "chosen"]
    if chosen:
        ax.scatter(
            [chosen[-1]["bits_per_weight"]],
            [value(chosen[-1]["held_out"])],
            marker="*",
            facecolors="none",
            edgecolors="k",
            label="chosen, held out",
        )
    ax.axhline(float(report["budget"].split("=")[-1]), color="grey", ls="--", label="budget")
    ax.set_xlabel("weight bits per value")
    ax.set_ylabel(f"{report['metric']} (search inputs)")
    ax.set_title(f"onnxq tune: {report['budget']}")
    ax.legend(fontsize="small")
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def write_all(files: Mapping[Path, bytes]) -> None:
    """Write every file to a temporary name, then rename them all into place.

    Raises:
        OSError: a file cannot be written (nothing is renamed then).
    """
    with contextlib.ExitStack() as stack:
        temps = []
        for target, data in files.items():
            _output.sweep(target.parent)
            f, temp = stack.enter_context(_output.new_file(target))
            f.write(data)
            f.flush()
            temps.append((temp, target))
        for temp, target in temps:
            _output.replace(temp, target)
