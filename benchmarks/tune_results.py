"""``onnxq tune`` on three real models: bits per weight against the cheapest single format.

For each model and budget, one search (weights only, cosine budget on the model's outputs
against float, every 4th sample held out) reports the bits per weight it reaches, the
cheapest single candidate format that meets the same budget (on the search and held-out
inputs), the held-out metric and the search's wall time with 1 and 2 local workers (no cache;
the two runs must agree). Small on purpose: few samples, few candidates.

- ``minilm``: paraphrase-MiniLM-L3-v2, the first ``--samples`` Lee news documents (gensim's
  test data, tokenised as in benchmarks/accuracy.py, 128 tokens); output: the pooled embedding.
- ``ppocr``: the PP-OCRv6 recognizer on rendered noisy text lines (benchmarks/accuracy.py).
- ``silero``: Silero VAD on seeded synthetic audio (harmonic bursts with an envelope, in
  noise; the real sample of benchmarks/accuracy.py needs a download), one 576-sample frame
  each, with the state the float model carries to that frame.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/tune_results.py --models minilm ppocr silero \\
        --json tune.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.accuracy import _minilm_output, minilm_task, ocr_task
from onnxq.tuning import tune
from tests.models.real import model_path

BUDGETS = {
    "minilm": ("cosine>=0.995", "cosine>=0.999"),
    # 0.99 is out of reach for PP-OCR's 18710-way softmax: every layer in bfp16 gives 0.984
    # held out (measured 2026-11-26).
    "ppocr": ("cosine>=0.95", "cosine>=0.98"),
    "silero": ("cosine>=0.999", "cosine>=0.9999"),
}


def _silero_samples(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    import onnxruntime as ort

    rng = np.random.default_rng(seed)
    t = np.arange(16000 * 8) / 16000.0
    audio = 0.01 * rng.standard_normal(t.size)
    for start in rng.uniform(0, 7, 6):  # voiced bursts: a few harmonics, smooth envelope
        f0 = rng.uniform(100, 220)
        env = np.exp(-(((t - start - 0.3) / 0.18) ** 2))
        audio += env * sum(0.3 / k * np.sin(2 * np.pi * k * f0 * t) for k in range(1, 6))
    audio = audio.astype(np.float32)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    sess = ort.InferenceSession(
        str(model_path("silero")), options, providers=["CPUExecutionProvider"]
    )
    state, context = np.zeros((2, 1, 128), np.float32), np.zeros(64, np.float32)
    frames = audio.size // 512
    keep = set(np.linspace(0, frames - 1, n).astype(int).tolist())
    samples = []
    for i in range(frames):
        chunk = audio[i * 512 : (i + 1) * 512]
        feed = {
            "input": np.concatenate([context, chunk])[None],
            "state": state,
            "sr": np.array(16000, np.int64),
        }
        if i in keep:
            samples.append({k: v.copy() for k, v in feed.items()})
        _, state = sess.run(None, feed)
        context = chunk[-64:]
    return samples


def model_and_samples(name: str, n: int, data: Path) -> tuple[onnx.ModelProto, list[dict]]:
    model = onnx.load(model_path(name))
    if name == "minilm":
        task = minilm_task(data, 128)
        samples = [
            {"input_ids": task.ids[i : i + 1], "attention_mask": task.mask[i : i + 1]}
            for i in range(n)
        ]
        return _minilm_output(model), samples
    if name == "ppocr":
        task = ocr_task(model, n, 320, 0.04, 0)
        return model, [{"x": task.images[i : i + 1]} for i in range(n)]
    return model, _silero_samples(n, 0)


def run(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    model, samples = model_and_samples(name, args.samples, args.data)
    rows = []
    for b, budget in enumerate(BUDGETS[name]):
        row: dict[str, Any] = {"model": name, "budget": budget}
        for workers in (1, 2) if b == 0 or args.both_budgets_timed else (1,):
            t0 = time.perf_counter()
            report = tune(model, samples, budget, candidates=args.candidates, workers=workers)
            row[f"seconds_{workers}w"] = time.perf_counter() - t0
            rep = report.report
            if "layers_" in row:  # the 2-worker run must find the same assignment
                assert rep["layers"] == row["layers_"], "workers changed the result"

            row.update(
                layers_=rep["layers"],
                bits_per_weight=rep["bits_per_weight"],
                single=rep["cheapest_single_format"],
                search=rep["search"]["metric"],
                held_out=rep["held_out"]["metric"],
                samples=f"{rep['search']['samples']}+{rep['held_out']['samples']}",
                trials=rep["trials"]["run"],
                repairs=rep["repairs"],
                formats={
                    f: sum(r["weights"] for r in rep["layers"] if r["format"] == f)
                    for f in rep["candidates"]
                },
            )
            print(f"{name} {budget} {workers}w: {row['bits_per_weight']:.3f} b/w, "
                  f"single {row['single']}, held-out {row['held_out']}, "
                  f"{row[f'seconds_{workers}w']:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| model | budget | tune bits/weight | cheapest single format (bits) | held-out metric "
        "| samples (search+held-out) | trials | wall 1 worker | wall 2 workers |"
    )
    out = [head, "|" + "---|" * 9]
    for r in rows:
        single = r["single"]
        single_text = f"{single['format']} ({single['bits_per_weight']:g})" if single else "none"
        two = f"{r['seconds_2w']:.0f} s" if "seconds_2w" in r else "-"
        out.append(
            f"| {r['model']} | `{r['budget']}` | {r['bits_per_weight']:.2f} | {single_text} "
            f"| {r['held_out']:.5f} | {r['samples']} | {r['trials']} | {r['seconds_1w']:.0f} s "
            f"| {two} |"
        )
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=["minilm", "ppocr", "silero"])
    p.add_argument("--samples", type=int, default=8, help="samples per model (every 4th held out)")
    p.add_argument("--candidates", default="mxfp4,mx6,mxfp8,bfp16")
    p.add_argument("--data", type=Path, default=Path("~/.cache/onnxq-bench"))
    p.add_argument("--both-budgets-timed", action="store_true", help="2 workers for both budgets")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    args.data = args.data.expanduser()
    rows = [r for name in args.models for r in run(name, args)]
    print(markdown(rows))
    if args.json:
        for r in rows:
            r.pop("layers_", None)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
