"""Activation fake-quantization in onnxruntime: QuantizeDequantizeMX vs the op pair vs Identity.

Three one-input sessions per format and shape, one intra-op thread, Y bound to a preallocated
array (io binding) so that no run allocates:

- ``identity``: x -> Identity -> y (onnxruntime's floor for a node that reads X and writes Y);
- ``fused``: x -> QuantizeDequantizeMX -> y (one pass, no codes);
- ``pair``: x -> QuantizeMX -> DequantizeMX -> y, DequantizeMX fed Shape(x) as the graph pass
  writes it for an activation of dynamic shape.

The variants are interleaved (one timed batch of each in turn, ``--repeat`` rounds) and each
column is the median over the rounds of the calling thread's CPU time per run
(``time.thread_time``: with one intra-op thread onnxruntime runs the node on the caller), so
the ratios are measured in the same run on a shared, noisy machine. The fused and pair outputs
are checked to be the same bits before timing.

A second table times NCHW activations (``NCHW_SHAPES``) tiled along their channels (axis 1,
the channel kernels) against the same tensor tiled along its last axis (the row kernels), both
fused, with Identity as the floor.

``--dtype float16`` times float16 activations (the casts convert them to float32 and back
around the float32 kernels).

Usage: python benchmarks/activation_qdq.py [--repeat 15] [--formats mxfp8 mxfp4 ...]
       [--no-nchw] [--dtype float32|float16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kernels  # benchmarks/kernels.py: cpu_name

SHAPES = [(64, 4096), (8, 128, 768)]
# EfficientNet-Lite0's activations (224x224 input) at each resolution, and a tiny inner size.
NCHW_SHAPES = [
    (1, 96, 112, 112),
    (1, 32, 112, 112),
    (1, 16, 112, 112),
    (1, 144, 56, 56),
    (1, 240, 28, 28),
    (1, 672, 14, 14),
    (1, 1152, 7, 7),
    (1, 128, 4),
]
FORMATS = ["mxfp8", "mxfp4", "mx6", "nvfp4", "bfp16"]


def _models(fmt: str, rank: int, axis: int = -1, dtype: str = "float32") -> dict[str, Any]:
    from onnx import TensorProto, helper

    from onnxq.graph.schemas import output_types

    dims = [f"d{i}" for i in range(rank)]
    elem = TensorProto.FLOAT16 if dtype == "float16" else TensorProto.FLOAT
    x = helper.make_tensor_value_info("x", elem, dims)
    y = helper.make_tensor_value_info("y", elem, dims)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    types = output_types("QuantizeMX", {"dtype": fmt})
    names = [
        n if e else "" for n, (e, _) in zip(("q", "s", "z", "t", "m", "k"), types, strict=True)
    ]
    graphs = {
        "identity": [helper.make_node("Identity", ["x"], ["y"])],
        "fused": [
            helper.make_node(
                "QuantizeDequantizeMX", ["x"], ["y"], domain="onnxq", dtype=fmt, axis=axis
            )
        ],
        "pair": [
            helper.make_node("QuantizeMX", ["x"], names, domain="onnxq", dtype=fmt, axis=axis),
            helper.make_node("Shape", ["x"], ["x_shape"]),
            helper.make_node(
                "DequantizeMX",
                [*names, "x_shape"],
                ["y"],
                domain="onnxq",
                dtype=fmt,
                axis=axis,
                output_type=elem,
            ),
        ],
    }
    return {
        k: helper.make_model(helper.make_graph(v, k, [x], [y]), opset_imports=opsets)
        for k, v in graphs.items()
    }


def _one_thread(ort: Any) -> Any:
    so = ort.SessionOptions()  # one per session: runtime.session registers the ops on it
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return so


def _medians(ort: Any, models: dict[str, Any], x: np.ndarray, repeat: int) -> dict[str, Any]:
    """Median thread CPU time per run of each model, interleaved; and each one's output."""
    from onnxq import runtime

    sessions = {k: runtime.session(m, sess_options=_one_thread(ort)) for k, m in models.items()}
    outs = {k: np.empty_like(x) for k in sessions}
    bindings = {}
    for k, sess in sessions.items():
        b = sess.io_binding()
        b.bind_cpu_input("x", x)
        b.bind_output("y", "cpu", 0, x.dtype, list(x.shape), outs[k].ctypes.data)
        bindings[k] = b
        sess.run_with_iobinding(b)  # warm-up
    # a batch of runs takes about 20 ms, so the thread clock's resolution does not matter
    batch = max(1, int(5e6 // x.size))
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(repeat):
        for k, sess in sessions.items():
            b = bindings[k]
            t0 = time.thread_time()
            for _ in range(batch):
                sess.run_with_iobinding(b)
            times[k].append((time.thread_time() - t0) / batch)
    return {"med": {k: statistics.median(v) for k, v in times.items()}, "out": outs}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    bits = f"u{a.dtype.itemsize}"
    return np.array_equal(a.view(bits), b.view(bits))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--formats", nargs="*", default=FORMATS)
    parser.add_argument("--no-nchw", action="store_true", help="skip the channel-axis table")
    parser.add_argument(
        "--dtype", choices=["float32", "float16"], default="float32", help="activation type"
    )
    args = parser.parse_args()

    import onnxruntime as ort

    print(
        f"CPU: {kernels.cpu_name()} ({os.cpu_count()} logical cores); one intra-op thread; "
        f"{args.dtype} activations"
    )
    print("thread CPU time per run, median of interleaved rounds; ratios in the same run")
    print(
        f"{'shape':<15} {'format':<8} {'identity':>9} {'fused':>9} {'pair':>9} "
        f"{'fused/id':>9} {'pair/id':>8} {'pair/fused':>11}"
    )
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        x = rng.standard_normal(shape, dtype=np.float32).astype(args.dtype)
        for fmt in args.formats:
            r = _medians(ort, _models(fmt, len(shape), dtype=args.dtype), x, args.repeat)
            if not _same(r["out"]["fused"], r["out"]["pair"]):
                raise SystemExit(f"{fmt} {shape}: the fused op and the pair disagree")
            med = r["med"]
            print(
                f"{shape!s:<15} {fmt:<8} {med['identity'] * 1e3:>7.3f}ms "
                f"{med['fused'] * 1e3:>7.3f}ms {med['pair'] * 1e3:>7.3f}ms "
                f"{med['fused'] / med['identity']:>9.2f} {med['pair'] / med['identity']:>8.2f} "
                f"{med['pair'] / med['fused']:>11.2f}"
            )
    if args.no_nchw:
        return
    print("\nNCHW activations, fused: tiles along the channels (axis 1) vs along the last axis")
    print(
        f"{'shape':<18} {'format':<8} {'identity':>9} {'axis 1':>9} {'last':>9} "
        f"{'ax1/id':>7} {'last/id':>8} {'ax1/last':>9}"
    )
    for shape in NCHW_SHAPES:
        x = rng.standard_normal(shape, dtype=np.float32).astype(args.dtype)
        for fmt in args.formats:
            ch = _models(fmt, len(shape), axis=1, dtype=args.dtype)
            models = {"identity": ch["identity"], "ax1": ch["fused"], "pair1": ch["pair"]}
            models["last"] = _models(fmt, len(shape), dtype=args.dtype)["fused"]
            r = _medians(ort, models, x, args.repeat)
            if not _same(r["out"]["ax1"], r["out"]["pair1"]):
                raise SystemExit(f"{fmt} {shape} axis 1: the fused op and the pair disagree")
            med = r["med"]
            print(
                f"{shape!s:<18} {fmt:<8} {med['identity'] * 1e3:>7.3f}ms "
                f"{med['ax1'] * 1e3:>7.3f}ms {med['last'] * 1e3:>7.3f}ms "
                f"{med['ax1'] / med['identity']:>7.2f} {med['last'] / med['identity']:>8.2f} "
                f"{med['ax1'] / med['last']:>9.2f}"
            )


if __name__ == "__main__":
    main()
