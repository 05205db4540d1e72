"""Fake-quant (virtual cast) speed on a 4096x4096 float32 tensor, per format, in one run.

Columns, each the best of ``--repeat`` timed runs after one warm-up:
- ``native``: ``onnxq.cast(x, fmt, backend="native")`` (allocates its output, like the
  reference and Quark columns);
- ``native out=``: the same cast into a preallocated array (``out=``), as ``np.copyto`` writes;
- ``ort``: QuantizeMX + DequantizeMX in an onnxruntime session (``onnxq.runtime``), when the
  custom ops are built, with its output Y bound (``io_binding().bind_output``) to a preallocated
  float32 array, so that it compares with ``np.copyto`` into a preallocated array;
- ``ort run``: the same session through plain ``sess.run``, which allocates Y and hands it to
  numpy (what a caller that does not bind outputs pays: the page faults of a fresh 64 MiB);
- ``reference``: the numpy reference engine (skipped with ``--no-reference``);
- ``quark``: AMD Quark's CPU custom ops (``BFPQuantizeDequantize`` / ``MXQuantizeDequantize``,
  domain ``com.amd.quark``) where Quark has the format and ``amd-quark`` imports;
- ``np.copyto`` of the same tensor into a preallocated array, the yardstick; ``x.copy()``,
  which allocates its output as the ``native`` column does, is printed beside it to show what
  the fresh 64 MiB (its page faults and zeroing) costs numpy itself.

Reported as ratios: time / np.copyto, and Quark / native. Issue 3's targets on the 2-core
development machine: native within 2x of np.copyto and at least 20x faster than Quark; the
session within 3x of np.copyto.

Usage: python benchmarks/kernels.py [--size 4096] [--repeat 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import onnxq

FORMATS = [
    "int8_e8m0_t8", "mx6", "mx9", "mxfp8e4", "mxfp6e2", "mxfp4", "mxint8", "nvfp4",
    "cb41fi_e2m2fnuz_e8m0_t32",
]  # fmt: skip

# Quark's op and attributes for the formats it has (axis 1 = the last axis of a 2-D tensor).
# bfp16 block 8 is Quark's DEFAULT_BFP_PARAMS; MX6/MX9 its DEFAULT_MICROEXPONENTS_PARAMS with
# bit_width 13/16; MXFP*/MXINT8 its DEFAULT_MICROSCALING_PARAMS with the element dtype.
_BFP = {"axis": 1, "rounding_mode": 2}
_PRIME = {
    "bfp_method": "to_bfp_prime",
    "axis": 1,
    "block_size": 16,
    "sub_block_size": 2,
    "sub_block_shift_bits": 1,
    "rounding_mode": 2,
}
_MX = {"axis": 1, "block_size": 32, "rounding_mode": 2}
QUARK = {
    "int8_e8m0_t8": (
        "BFPQuantizeDequantize",
        {**_BFP, "bfp_method": "to_bfp", "bit_width": 16, "block_size": 8},
    ),
    "mx6": ("BFPQuantizeDequantize", {**_PRIME, "bit_width": 13}),
    "mx9": ("BFPQuantizeDequantize", {**_PRIME, "bit_width": 16}),
    "mxfp8e4": ("MXQuantizeDequantize", {**_MX, "element_dtype": "fp8_e4m3"}),
    "mxfp6e2": ("MXQuantizeDequantize", {**_MX, "element_dtype": "fp6_e2m3"}),
    "mxfp4": ("MXQuantizeDequantize", {**_MX, "element_dtype": "fp4_e2m1"}),
    "mxint8": ("MXQuantizeDequantize", {**_MX, "element_dtype": "int8"}),
}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def best(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm-up (library load, session first run, page faults of cached buffers)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def quark_session(name: str, shape: tuple[int, ...]) -> Callable[[np.ndarray], Any] | None:
    """An onnxruntime session of Quark's op for this format, or None (no Quark, no format)."""
    if name not in QUARK:
        return None
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper
        from quark.onnx.operators.custom_ops import get_library_path
    except Exception:
        return None
    op, attrs = QUARK[name]
    node = helper.make_node(op, ["x"], ["y"], domain="com.amd.quark", **attrs)
    graph = helper.make_graph(
        [node],
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.amd.quark", 1)]
    )
    so = ort.SessionOptions()
    so.register_custom_ops_library(get_library_path("CPU"))
    sess = ort.InferenceSession(
        onnx._serialize(model) if hasattr(onnx, "_serialize") else model.SerializeToString(),
        so,
        providers=["CPUExecutionProvider"],
    )
    return lambda x: sess.run(None, {"x": x})[0]


def qdq_model(name: str, shape: tuple[int, ...], parts: bool = False) -> Any:
    """The QuantizeMX + DequantizeMX (or CodebookLookup) model of this format along the last
    axis; with ``parts``, its two nodes and QuantizeMX's output names ("" for absent ones)."""
    from onnx import TensorProto, helper

    from onnxq.formats.datatype import datatype

    dt = datatype(name)
    s = dt.sspec
    names = ["q", "scale"]
    names.append("zero" if s is not None and s.zero is not None else "")
    names.append("tenscale" if s is not None and s.tenscale is not None else "")
    has_meta = s is not None and (s.subtile[1] > 0 or hasattr(dt.nspec, "index_bits"))
    names.append("meta" if has_meta else "")
    names.append("mask" if s is not None and s.sparsity[1] else "")
    while names and not names[-1]:
        names.pop()
    attrs = {"dtype": name, "axis": -1}
    quant = helper.make_node("QuantizeMX", ["x"], names, domain="onnxq", **attrs)
    dequant_op = "CodebookLookup" if hasattr(dt.nspec, "index_bits") else "DequantizeMX"
    if dequant_op == "CodebookLookup":
        inputs = ["q", "meta", "scale"]
    else:
        inputs = names
    dequant = helper.make_node(
        dequant_op, inputs, ["y"], domain="onnxq", shape=list(shape), **attrs
    )
    if parts:
        return (quant, dequant), names
    graph = helper.make_graph(
        [quant, dequant],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )


def onnxq_session(
    name: str, shape: tuple[int, ...]
) -> tuple[Callable[[np.ndarray], Any], Callable[[np.ndarray, np.ndarray], Any]] | None:
    """QuantizeMX + DequantizeMX in an onnxruntime session, or None (no custom ops yet): a
    function of x through ``sess.run`` and one of (x, y) that writes into the preallocated
    float32 array y through io binding."""
    try:
        from onnxq import runtime

        if not runtime.has_custom_ops():
            return None
    except Exception:
        return None
    try:
        sess = runtime.session(qdq_model(name, shape))
    except Exception as err:
        print(f"  (onnxq session for {name} failed: {str(err).splitlines()[0][:100]})")
        return None

    def bound(x: np.ndarray, y: np.ndarray) -> None:
        binding = sess.io_binding()
        binding.bind_cpu_input("x", x)
        binding.bind_output("y", "cpu", 0, y.dtype, y.shape, y.ctypes.data)
        sess.run_with_iobinding(binding)

    return (lambda x: sess.run(None, {"x": x})[0]), bound


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096, help="rows and columns of the tensor")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per column (best kept)")
    parser.add_argument("--formats", nargs="*", default=None, help="formats (default: all)")
    parser.add_argument("--no-reference", action="store_true", help="skip the numpy reference")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    shape = (args.size, args.size)
    x = rng.standard_normal(shape, dtype=np.float32)
    dst = np.empty_like(x)
    y = np.empty_like(x)  # the bound output of the ort column
    copy = best(lambda: np.copyto(dst, x), args.repeat * 2)
    copy_alloc = best(lambda: x.copy(), args.repeat)
    cpu = cpu_name()
    print(f"CPU: {cpu} ({os.cpu_count()} logical cores); tensor {shape} float32")
    print(
        f"np.copyto: {copy * 1e3:.2f} ms; other columns as multiples of it "
        f"(x.copy(), allocating: {copy_alloc / copy:.1f}x)"
    )
    print(
        f"{'format':<26} {'native':>8} {'out=':>8} {'ort':>8} {'ort run':>8} {'reference':>10} "
        f"{'quark':>8} {'quark/native':>13}"
    )
    results: dict[str, Any] = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "shape": list(shape),
        "copyto_s": copy,
        "copy_alloc_s": copy_alloc,
        "formats": {},
    }
    for name in args.formats or FORMATS:
        row: dict[str, float | None] = {}
        row["native_s"] = best(lambda n=name: onnxq.cast(x, n, backend="native"), args.repeat)
        row["native_out_s"] = best(
            lambda n=name: onnxq.cast(x, n, backend="native", out=dst), args.repeat
        )
        sess = onnxq_session(name, shape)
        row["ort_s"] = best(lambda s=sess: s[1](x, y), args.repeat) if sess else None
        row["ort_run_s"] = best(lambda s=sess: s[0](x), args.repeat) if sess else None
        few = max(1, args.repeat // 3)
        row["reference_s"] = (
            None
            if args.no_reference
            else best(lambda n=name: onnxq.cast(x, n, backend="reference"), few)
        )
        quark = quark_session(name, shape)
        row["quark_s"] = best(lambda q=quark: q(x), few) if quark else None
        results["formats"][name] = row

        def ratio(key: str, row: dict[str, float | None] = row) -> str:
            v = row[key]
            return "-" if v is None else f"{v / copy:.1f}x"

        q_over_n = "-" if row["quark_s"] is None else f"{row['quark_s'] / row['native_s']:.0f}x"
        print(
            f"{name:<26} {ratio('native_s'):>8} {ratio('native_out_s'):>8} {ratio('ort_s'):>8} "
            f"{ratio('ort_run_s'):>8} {ratio('reference_s'):>10} {ratio('quark_s'):>8} "
            f"{q_over_n:>13}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
