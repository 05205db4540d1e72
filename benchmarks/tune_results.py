"""``onnxq tune`` on three real models: bits per weight against the cheapest single format.

For each model and budget, one search (weights only, a budget on the model's outputs against
float: cosine, or PP-OCR's text agreement; every 4th sample held out) reports the bits per
weight it reaches, the cheapest single candidate format that meets the same budget (on the
search and held-out inputs), the held-out metric and the search's wall time with 1 and 2
local workers (no cache; the two runs must agree). Small on purpose: few samples, few
candidates.

- ``minilm``: paraphrase-MiniLM-L3-v2, the first ``--samples`` Lee news documents (gensim's
  test data, tokenised as in benchmarks/accuracy.py, 128 tokens); output: the pooled embedding.
- ``ppocr``: the PP-OCRv6 recognizer on rendered noisy text lines (benchmarks/accuracy.py),
  budgeted by a callable: the agreement of the decoded text, 1 - CER of the quantized model's
  greedy CTC decode against the float model's (edit distances summed over a split's lines,
  over the float text's characters; the character list is the model's own, as rapidocr reads
  it): what an OCR user budgets is the text read, which a cosine of the 18710-way softmax does
  not say.
- ``silero``: Silero VAD on seeded synthetic audio (harmonic bursts with an envelope, in
  noise; the real sample of benchmarks/accuracy.py needs a download), one 576-sample frame
  each, with the state the float model carries to that frame.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/tune_results.py --models minilm ppocr silero \\
        --json tune.json
    OMP_NUM_THREADS=1 python benchmarks/tune_results.py --models ppocr --samples 16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.accuracy import _minilm_output, ctc_greedy, edit_distance, minilm_task, ocr_task
from onnxq.tuning import Budget, tune
from tests.models.real import model_path

BUDGETS: dict[str, tuple[Any, ...]] = {
    "minilm": ("cosine>=0.995", "cosine>=0.999"),
    # text agreement with float (TextAgreement); 0.99 is out of reach: with every layer in
    # bfp16 one character of the held-out lines differs (0.978 of 45 with --samples 8, 0.988
    # of 84 with --samples 16; measured 2026-11-26)
    "ppocr": (("text", 0.90), ("text", 0.97)),
    "silero": ("cosine>=0.999", "cosine>=0.9999"),
}


@dataclasses.dataclass(frozen=True)
class TextAgreement:
    """1 - CER of the quantized model's greedy CTC decode against the float model's.

    A tune budget callable ``(float_outputs, quant_outputs) -> float`` (module level, so that
    worker processes can unpickle it); ``charset`` is index -> character (0: blank).
    """

    charset: tuple[str, ...]

    def __call__(self, ref: list[dict[str, np.ndarray]], got: list[dict[str, np.ndarray]]) -> float:
        """The agreement over all lines of a split (1.0: the same text everywhere)."""
        errors = total = 0
        for r, g in zip(ref, got, strict=True):
            want = ctc_greedy(next(iter(r.values()))[0], list(self.charset))
            read = ctc_greedy(next(iter(g.values()))[0], list(self.charset))
            errors += edit_distance(read, want)
            total += len(want)
        return 1.0 - errors / max(total, 1)


def budget_of(name: str, spec: Any, charset: tuple[str, ...] | None) -> Budget | str:
    """The tune budget for a BUDGETS entry (the text agreement needs the model's charset)."""
    if isinstance(spec, str):
        return spec
    assert charset is not None
    return Budget(TextAgreement(charset), spec[1], name="text_agreement")


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


def model_and_samples(
    name: str, n: int, data: Path
) -> tuple[onnx.ModelProto, list[dict], tuple[str, ...] | None]:
    """The model to tune, its samples, and (PP-OCR) its character list."""
    model = onnx.load(model_path(name))
    if name == "minilm":
        task = minilm_task(data, 128)
        samples = [
            {"input_ids": task.ids[i : i + 1], "attention_mask": task.mask[i : i + 1]}
            for i in range(n)
        ]
        return _minilm_output(model), samples, None
    if name == "ppocr":
        task = ocr_task(model, n, 320, 0.04, 0)
        return model, [{"x": task.images[i : i + 1]} for i in range(n)], tuple(task.charset)
    return model, _silero_samples(n, 0), None


def run(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    model, samples, charset = model_and_samples(name, args.samples, args.data)
    rows = []
    for b, spec in enumerate(BUDGETS[name]):
        if args.budgets is not None and b not in args.budgets:
            continue
        budget = budget_of(name, spec, charset)
        text = budget if isinstance(budget, str) else budget.text
        row: dict[str, Any] = {"model": name, "budget": text}
        for workers in args.workers if b == 0 or args.both_budgets_timed else args.workers[:1]:
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
            print(f"{name} {text} {workers}w: {row['bits_per_weight']:.3f} b/w, "
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
        one, two = (f"{r[k]:.0f} s" if k in r else "-" for k in ("seconds_1w", "seconds_2w"))
        out.append(
            f"| {r['model']} | `{r['budget']}` | {r['bits_per_weight']:.2f} | {single_text} "
            f"| {r['held_out']:.5f} | {r['samples']} | {r['trials']} | {one} "
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
    p.add_argument(
        "--workers", type=int, nargs="+", default=[1, 2], help="worker counts (the first budget)"
    )
    p.add_argument("--budgets", type=int, nargs="+", help="only these budgets (0, 1) of a model")
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
