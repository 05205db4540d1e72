"""Weight scale modes on the real models: output cosine to float, weights only.

For each model, format and weight scale mode, the weights are quantized with
``quantize_model(m, recipe={"weights": fmt, "weight_scale_mode": mode},
weight_storage="fake")`` (activations stay float) and the model's first output is compared
with the float model's on one short input: cosine similarity of the flattened outputs
(float64). This is what docs/formats.md ("Scale modes") reports and what chose the default
weight scale mode (``onnxq.graph.recipe.DEFAULT_WEIGHT_SCALE_MODE``).

Models (skipped, with a line saying why, when their package is missing):

- ``det``: the PP-OCRv4 text detector of ``rapidocr-onnxruntime`` (``models/`` folder), on
  three lines of text rendered with matplotlib at 160x448, normalised as rapidocr does
  ((x / 255 - 0.5) / 0.5); output: the text probability map.
- ``rec``: the PP-OCRv6 small recognizer of ``rapidocr`` on `tests.models.real.example_inputs`.
- ``minilm``: paraphrase-MiniLM-L3-v2, 2 x 16 word pieces (``example_inputs``); output: the
  two sentence embeddings.
- ``silero``: Silero VAD, one 576-sample frame of noise and a zero state (``example_inputs``).

``rceil`` is the format's rounding-up rule (2^ceil(log2(absmax / maxfloat))); it is the
same as ``floor`` for int elements (MXINT8, BFP16, MX9/6/4: their scale is always floor) and
for float scales (NVFP4: absmax / 6 rounded to E4M3), where only ``search`` changes the scale.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/weight_scales.py --json out.json --markdown out.md
    python benchmarks/weight_scales.py --models det --formats mxfp8 mxfp4 --modes floor search
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ and onnxq/ in a checkout

import onnxq
from tests.models.real import MissingModelError, example_inputs, model_path

FORMATS = ("mxfp8", "mxfp6", "mxfp4", "bfp16", "nvfp4")
MODES = ("floor", "rceil", "search")
MODELS = ("det", "rec", "minilm", "silero")


def _det_path() -> Path:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")  # finds, does not import (cv2)
    if spec is None or not spec.submodule_search_locations:
        raise MissingModelError("the PP-OCRv4 detector needs rapidocr-onnxruntime")
    folder = Path(next(iter(spec.submodule_search_locations)))
    path = folder / "models" / "ch_PP-OCRv4_det_infer.onnx"
    if not path.is_file():
        raise MissingModelError(f"rapidocr-onnxruntime has no {path.name}")
    return path


def _det_input() -> dict[str, np.ndarray]:
    """Three lines of dark text on white, 160x448, rendered with matplotlib (Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig = plt.figure(figsize=(4.48, 1.6), dpi=100)
    for i, line in enumerate(("Quantized weights, 2026", "MXFP8 E4M3 scales", "onnxq 0123456789")):
        fig.text(0.04, 0.75 - 0.3 * i, line, fontsize=17, color="black")
    fig.canvas.draw()
    rgb = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(np.float32)
    plt.close(fig)
    x = (rgb.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5  # rapidocr: mean 0.5, std 0.5
    return {"x": x[None].astype(np.float32)}


def load(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The float model and its input (raises MissingModelError when not installed)."""
    if name == "det":
        return onnx.load(str(_det_path())), _det_input()
    real = {"rec": "ppocr", "minilm": "minilm", "silero": "silero"}[name]
    return onnx.load(str(model_path(real))), example_inputs(
        real, batch=1 if name != "minilm" else 2
    )


def outputs(model: onnx.ModelProto, feed: dict[str, np.ndarray], name: str = "") -> np.ndarray:
    """The compared outputs in onnxruntime (one thread), flattened and concatenated.

    Every output, but MiniLM's sentence embedding only (its other outputs echo the token ids
    and mask, or hold the per-token states the embedding pools).
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    outs = sess.run(None, {k: v for k, v in feed.items() if k in names})
    if name == "minilm":
        outs = outs[-1:]
    return np.concatenate([np.asarray(o, np.float64).ravel() for o in outs])


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two flattened arrays (float64)."""
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    den = float(np.linalg.norm(a64) * np.linalg.norm(b64))
    return float(a64 @ b64 / den) if den else float("nan")


def measure(
    models: Sequence[str], formats: Sequence[str], modes: Sequence[str]
) -> list[dict[str, object]]:
    """One row per (model, format, mode): the output cosine to float and the seconds taken."""
    rows: list[dict[str, object]] = []
    for name in models:
        try:
            model, feed = load(name)
        except MissingModelError as err:
            print(f"{name}: skipped ({err})", file=sys.stderr)
            continue
        ref = outputs(model, feed, name)
        for fmt in formats:
            for mode in modes:
                start = time.perf_counter()
                q = onnxq.quantize_model(
                    model,
                    recipe={"weights": fmt, "weight_scale_mode": mode},
                    weight_storage="fake",
                )
                seconds = time.perf_counter() - start
                out = outputs(q, feed, name)
                cos = cosine(ref, out)
                rel = float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))
                rows.append(
                    {
                        "model": name,
                        "format": fmt,
                        "mode": mode,
                        "cosine": cos,
                        "rel_err": rel,
                        "quantize_s": round(seconds, 2),
                    }
                )
                print(
                    f"{name:7s} {fmt:7s} {mode:7s} cosine {cos:.6f} rel {rel:.5f} "
                    f"({seconds:.1f} s)",
                    file=sys.stderr,
                )
    return rows


def markdown(rows: list[dict[str, object]], modes: Sequence[str]) -> str:
    """One line per model and format: cosine, then relative error, per mode (best in bold)."""
    head = " | ".join(f"cos {m}" for m in modes) + " | " + " | ".join(f"rel {m}" for m in modes)
    lines = [f"| model | format | {head} |", "|---|---|" + "---|" * (2 * len(modes))]
    keys = dict.fromkeys((r["model"], r["format"]) for r in rows)
    for model, fmt in keys:
        mine = [r for r in rows if (r["model"], r["format"]) == (model, fmt)]
        cells = []
        for metric, best_of in (("cosine", max), ("rel_err", min)):
            vals = {r["mode"]: float(r[metric]) for r in mine}
            best = best_of(vals.values())
            for m in modes:
                text = f"{vals[m]:.4f}" if m in vals else "-"
                cells.append(f"**{text}**" if vals.get(m) == best else text)
        lines.append(f"| {model} | {fmt} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the measurement; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--formats", nargs="+", default=list(FORMATS))
    parser.add_argument("--modes", nargs="+", default=list(MODES))
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--markdown", type=Path, help="write the table here")
    args = parser.parse_args(argv)
    rows = measure(args.models, args.formats, args.modes)
    table = markdown(rows, args.modes)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
