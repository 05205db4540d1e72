"""Channel tiles (``_t0``: one tile per row) of every row length, native against the reference.

The vector dequantize path split rows into segments of whole tiles that start on a byte; for a
tile length that is not a multiple of 8 its search for that length never ended, so DequantizeMX
spun forever on rows of 11, 12 or 33 elements. Every case here runs in a child process with a
time limit, so a hang fails the test instead of blocking the run. Both ways into the kernels
are covered: the C ABI (one byte a code, `onnxq.cast.native`) and the custom ops in onnxruntime
(packed codes, `onnxq.runtime.session`), with the vector kernels of every instruction set this
CPU has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from onnxq import runtime

pytestmark = pytest.mark.needs_native

# One of each family a channel tile can have: exponent (E8M0) scales over int, fp4, fp6 and fp8
# elements (the vector path), a float scale (NVFP4-like), a float scale with a zero point, and
# an implicit codebook (its own lookup path). Two-D tiles with a channel dim on the tile axis.
CHANNEL_DTYPES = [
    "int8_e8m0_t0",
    "int4_e8m0_t0",
    "e2m1fnuz_e8m0_t0",
    "e3m2fnuz_e8m0_t0",
    "e4m3fn_e8m0_t0",
    "e5m2_e8m0_t0",
    "e2m1fnuz_e4m3_t0",
    "int8_float32_t0",
    "uint8_float32_uint8_t0",
    "cb41fi_e2m2fnuz_e8m0_t0",
    "e4m3fn_e8m0_t0_t2",
]
LENGTHS = list(range(1, 71))
# The whole sweep takes a few seconds; a hang is cut off at this limit.
LIMIT_S = 240

_CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import onnxq
    from onnxq.cast import native

    import os
    dtypes, lengths, use_ort, levels = json.loads(sys.argv[1])
    if use_ort:
        from onnx import TensorProto, helper
        from onnxq import runtime
        from onnxq.graph.schemas import output_types

    def data(shape, seed):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal(shape) * np.exp2(rng.integers(-6, 6, shape))
        x[rng.random(shape) < 0.05] = 0.0
        return x.astype(np.float32)

    def same(a, b):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))

    def shapes(n):
        # (shape, axis): along the last axis (the vector path), along the first, and a middle
        # axis of a 3-D tensor.
        return [((3, n), -1), ((n, 5), 0), ((2, n, 3), 1)]

    def ort_model(dt, cases):
        # One QuantizeMX -> DequantizeMX pair per case, every output a graph output.
        nodes, inputs, outputs = [], [], []
        for i, (shape, axis) in enumerate(cases):
            types = output_types("QuantizeMX", {"dtype": dt, "axis": axis}, shape)
            names = [f"{k}{i}" if elem else "" for k, (elem, _) in
                     zip(("q", "s", "z", "t", "m", "k"), types)]
            while not names[-1]:
                names.pop()
            nodes.append(helper.make_node("QuantizeMX", [f"x{i}"], names, domain="onnxq",
                                          dtype=dt, axis=axis))
            nodes.append(helper.make_node("DequantizeMX" if not dt.startswith("cb")
                                          else "CodebookLookup",
                                          names if not dt.startswith("cb")
                                          else [names[0], names[4], names[1]],
                                          [f"y{i}"], domain="onnxq", dtype=dt, axis=axis,
                                          shape=list(shape)))
            inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, shape))
            outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, shape))
            outputs += [helper.make_tensor_value_info(n, elem, None)
                        for n, (elem, _) in zip(names, types) if n]
        graph = helper.make_graph(nodes, "channel", inputs, outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                        helper.make_opsetid("onnxq", 1)])
        return runtime.session(model)

    bad = []
    for dt, level in [(dt, level) for dt in dtypes for level in levels]:
        # The library reads ONNXQ_SIMD at every call: one reference serves every level.
        os.environ["ONNXQ_SIMD"] = level
        d = onnxq.datatype(dt)
        # and one row so long (2^17 + 5, odd) that its segments are single tiles that start
        # off a byte of the codes
        cases = [c for n in lengths for c in shapes(n)] + [((2, 131077), -1)]
        if level == levels[0]:
            xs = [data(shape, seed) for seed, (shape, _) in enumerate(cases)]
            refs = [onnxq.cast(x, dt, axis=axis, mode="compress", backend="reference")
                    for x, (_, axis) in zip(xs, cases)]
            ref_values = [onnxq.upcast(r, np.float32) for r in refs]
        for (shape, axis), x, ref, want in zip(cases, xs, refs, ref_values):
            # The C ABI: codes one byte each, decoded by native.dequantize.
            enc = native.quantize(x, d, axis=axis)
            y = native.dequantize(d, shape, axis, enc.codes, enc.scale, enc.zero, enc.tenscale,
                                  enc.meta)
            if not same(y, want) or not same(enc.values, want):
                bad.append(f"C ABI {dt} {shape} axis {axis} ONNXQ_SIMD={level}")
        if use_ort:
            sess = ort_model(dt, cases)
            got = sess.run(None, {f"x{i}": x for i, x in enumerate(xs)})
            names = [o.name for o in sess.get_outputs()]
            out = dict(zip(names, got))
            for i, ((shape, axis), ref, want) in enumerate(zip(cases, refs, ref_values)):
                ok = same(out[f"y{i}"], want) and np.array_equal(out[f"q{i}"], ref.data)
                ok = ok and np.array_equal(out[f"s{i}"], ref.scale)
                if not ok:
                    bad.append(f"onnxruntime {dt} {shape} axis {axis} ONNXQ_SIMD={level}")
    print(json.dumps(bad))
    """
)


def _run_child(dtypes: list[str], use_ort: bool, levels: list[str]) -> list[str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, json.dumps([dtypes, LENGTHS, use_ort, levels])],
            capture_output=True,
            text=True,
            timeout=LIMIT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the casts of {dtypes} ({levels}) did not finish in {LIMIT_S} s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _simd_levels() -> list[str]:
    """ONNXQ_SIMD values: the general path, then every instruction set this CPU has."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    levels = ["none", "base"]
    if " avx2" in flags:
        levels.append("avx2")
    if " avx512bw" in flags:
        levels.append("avx512")
    return levels


def test_channel_tiles_every_row_length() -> None:
    """Rows of 1..70 elements along every axis kind, bit for bit with the reference."""
    bad = _run_child(CHANNEL_DTYPES, runtime.has_custom_ops(), _simd_levels())
    assert not bad, f"{len(bad)} mismatches, first: {bad[:10]}"
