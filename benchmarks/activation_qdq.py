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

Usage: python benchmarks/activation_qdq.py [--repeat 15] [--formats mxfp8 mxfp4 ...]
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
FORMATS = ["mxfp8", "mxfp4", "mx6", "nvfp4", "bfp16"]


def _models(fmt: str, rank: int) -> dict[str, Any]:
    from onnx import TensorProto, helper

    from onnxq.graph.schemas import output_types

    dims = [f"d{i}" for i in range(rank)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    types = output_types("QuantizeMX", {"dtype": fmt})
    names = [
        n if e else "" for n, (e, _) in zip(("q", "s", "z", "t", "m", "k"), types, strict=True)
    ]
    graphs = {
        "identity": [helper.make_node("Identity", ["x"], ["y"])],
        "fused": [
            helper.make_node("QuantizeDequantizeMX", ["x"], ["y"], domain="onnxq", dtype=fmt)
        ],
        "pair": [
            helper.make_node("QuantizeMX", ["x"], names, domain="onnxq", dtype=fmt),
            helper.make_node("Shape", ["x"], ["x_shape"]),
            helper.make_node("DequantizeMX", [*names, "x_shape"], ["y"], domain="onnxq", dtype=fmt),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--formats", nargs="*", default=FORMATS)
    args = parser.parse_args()

    import onnxruntime as ort

    from onnxq import runtime

    print(f"CPU: {kernels.cpu_name()} ({os.cpu_count()} logical cores); one intra-op thread")
    print("thread CPU time per run, median of interleaved rounds; ratios in the same run")
    print(
        f"{'shape':<15} {'format':<8} {'identity':>9} {'fused':>9} {'pair':>9} "
        f"{'fused/id':>9} {'pair/id':>8} {'pair/fused':>11}"
    )
    rng = np.random.default_rng(0)
    for shape in SHAPES:
        x = rng.standard_normal(shape, dtype=np.float32)
        # a batch of runs takes about 20 ms, so the thread clock's resolution does not matter
        batch = max(1, int(5e6 // x.size))
        for fmt in args.formats:
            sessions = {
                k: runtime.session(m, sess_options=_one_thread(ort))
                for k, m in _models(fmt, len(shape)).items()
            }
            outs = {k: np.empty_like(x) for k in sessions}
            bindings = {}
            for k, sess in sessions.items():
                b = sess.io_binding()
                b.bind_cpu_input("x", x)
                b.bind_output("y", "cpu", 0, np.float32, list(shape), outs[k].ctypes.data)
                bindings[k] = b
                sess.run_with_iobinding(b)  # warm-up
            if not np.array_equal(outs["fused"].view(np.uint32), outs["pair"].view(np.uint32)):
                raise SystemExit(f"{fmt} {shape}: the fused op and the pair disagree")
            times: dict[str, list[float]] = {k: [] for k in sessions}
            for _ in range(args.repeat):
                for k, sess in sessions.items():
                    b = bindings[k]
                    t0 = time.thread_time()
                    for _ in range(batch):
                        sess.run_with_iobinding(b)
                    times[k].append((time.thread_time() - t0) / batch)
            med = {k: statistics.median(v) for k, v in times.items()}
            print(
                f"{shape!s:<15} {fmt:<8} {med['identity'] * 1e3:>7.3f}ms "
                f"{med['fused'] * 1e3:>7.3f}ms {med['pair'] * 1e3:>7.3f}ms "
                f"{med['fused'] / med['identity']:>9.2f} {med['pair'] / med['identity']:>8.2f} "
                f"{med['pair'] / med['fused']:>11.2f}"
            )


if __name__ == "__main__":
    main()
