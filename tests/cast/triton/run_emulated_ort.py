"""The CUDA execution provider's kernels on a CPU-only onnxruntime: the cases that
`test_cuda_emulated` checks.

``ops/src/ort_kernel_cuda.cc`` (QuantizeMX / DequantizeMX / CodebookLookup registered for the
CUDA provider) needs onnxruntime-gpu, which is not installable everywhere. With
``ONNXQ_CUDA_OPS_ON_CPU_PROVIDER=1`` the library registers those kernels for the CPU provider
instead of its CPU ones, and with the fake driver (`fake_cuda`, ``ONNXQ_LIBCUDA``) host memory
is device memory: so a CPU session runs the CUDA kernels' own code (attributes, checks, output
shapes, the launches) with each launch emulated in Triton's interpreter. Tensors are bound with
onnxruntime's IOBinding to buffers registered as device memory; Shape and Table stay in host
memory, as on the CUDA provider.

Run as a script with ``TRITON_INTERPRET=1``, ``ONNXQ_LIBCUDA`` and
``ONNXQ_CUDA_OPS_ON_CPU_PROVIDER=1``; prints one JSON object: ``bad``, ``refused``,
``launches``, ``errors`` (as `run_emulated`).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import onnxq

_ = onnxq.cast
from run_emulated import (  # noqa: E402
    GENERIC,
    LOOKUPS,
    PRESET_SHAPES,
    PRESETS,
    Run,
    _input,
    _preset_input,
)

from onnxq import runtime  # noqa: E402
from onnxq.formats.datatype import datatype  # noqa: E402

ONNX_OUT = {0: TensorProto.FLOAT, 1: TensorProto.FLOAT16, 2: TensorProto.BFLOAT16}
NP_OUT = {0: np.float32, 1: np.float16, 2: ml_dtypes.bfloat16}
Q_OUTPUTS = ("q", "scale", "zero", "tenscale", "meta", "mask")


def _model(nodes: list[Any], inputs: dict[str, np.ndarray], outputs: dict[str, int]) -> bytes:
    def info(name: str, a: np.ndarray) -> Any:
        elem = TensorProto.BFLOAT16 if a.dtype == ml_dtypes.bfloat16 else None
        return helper.make_tensor_value_info(
            name, elem or helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)
        )

    graph = helper.make_graph(
        nodes,
        "g",
        [info(n, a) for n, a in inputs.items()],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    return model.SerializeToString()


class OrtRun:
    """Sessions whose onnxq nodes run the CUDA kernels on the fake driver."""

    def __init__(self) -> None:
        self.r = Run()
        self.options = ort.SessionOptions()
        self.options.register_custom_ops_library(runtime.library_path())
        self.options.log_severity_level = 2  # the host fallback's warnings (stderr)
        self.copies: dict[str, list[int]] = {}  # case -> bytes to host, to device, syncs
        self.sizes: dict[str, list[int]] = {}  # case -> bytes of device inputs, of outputs
        self.r.emu.lib.fake_counts.argtypes = [ctypes.POINTER(ctypes.c_uint64)]

    def _counts(self) -> list[int]:
        c = (ctypes.c_uint64 * 3)()
        self.r.emu.lib.fake_counts(c)
        return list(c)

    def run(
        self,
        name: str,
        nodes: list[Any],
        device: dict[str, np.ndarray],
        host: dict[str, np.ndarray],
        outputs: dict[str, np.ndarray],
        runs: int = 1,
    ) -> bool:
        """Runs the graph `runs` times (the outputs zeroed before each) with `device` inputs
        and `outputs` in registered buffers, `host` inputs in plain memory; False (the message
        in `refused`) when onnxruntime refuses."""
        elem = {np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16}
        types = {
            n: elem.get(a.dtype) or helper.np_dtype_to_tensor_dtype(a.dtype)
            for n, a in outputs.items()
        }
        first, counts = len(self.r.emu.log), self._counts()
        print(f"== {name}", file=sys.stderr, flush=True)  # the log's warnings follow
        try:
            sess = ort.InferenceSession(
                _model(nodes, {**device, **host}, types), self.options,
                providers=["CPUExecutionProvider"],
            )  # fmt: skip
            binding = sess.io_binding()
            for a in device.values():
                self.r.dev(a)
            for n, a in {**device, **host}.items():
                binding.bind_ortvalue_input(n, _ortvalue(a))
            for n, a in outputs.items():
                self.r.dev(a)
                binding.bind_ortvalue_output(n, _ortvalue(a))
            for _ in range(runs):
                for a in outputs.values():
                    a[...] = 0
                sess.run_with_iobinding(binding)
            return True
        except Exception as err:  # onnxruntime raises its own exception types
            self.r.refused[name] = str(err)
            return False
        finally:
            self.r.launches[name] = self.r.emu.log[first:]
            self.copies[name] = [b - a for a, b in zip(counts, self._counts(), strict=True)]
            # what a host fallback copies each run: the device inputs, the outputs
            in_bytes = sum(a.nbytes for a in device.values())
            self.sizes[name] = [in_bytes * runs, sum(a.nbytes for a in outputs.values()) * runs]


def _ortvalue(a: np.ndarray) -> Any:
    """An OrtValue over the array's own memory (onnxruntime types bfloat16 from uint16 bits)."""
    if a.dtype == ml_dtypes.bfloat16:
        v = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(np.uint16), ONNX_OUT[2])
    else:
        v = ort.OrtValue.ortvalue_from_numpy(a)
    if a.size and v.data_ptr() != a.ctypes.data:
        raise RuntimeError("onnxruntime copied a bound buffer")
    return v


def _registered(a: np.ndarray) -> np.ndarray:
    """A copy the emulator registers (the reference's arrays may be views)."""
    return np.ascontiguousarray(a).copy()


def quantize_dequantize(o: OrtRun) -> None:
    """QuantizeMX and DequantizeMX of every preset: the fast kernel (last axis a multiple of
    the tile) and the general one, float32 and bfloat16 in and out, Shape as attribute and as
    a host input."""
    for i, preset in enumerate(PRESETS):
        for shape in PRESET_SHAPES:
            tag = f"{preset} {shape}"
            for x_type in (0, 2):
                x, xr = _preset_input(shape, 80 + i, x_type)
                if x_type == 2:
                    x = x.view(ml_dtypes.bfloat16)
                want = onnxq.cast(xr, preset, mode="compress", backend="reference")
                fields = _fields(want)
                outs = {n: np.zeros(a.shape, a.dtype) for n, a in fields.items()}
                names = [n if n in fields else "" for n in Q_OUTPUTS]
                node = helper.make_node("QuantizeMX", ["x"], names, domain="onnxq", dtype=preset)
                name = f"ort {tag} quantize {x_type}"
                if o.run(name, [node], {"x": _registered(x)}, {}, outs):
                    if not all(np.array_equal(outs[n], fields[n]) for n in fields):
                        o.r.bad.append(name)
                qdq(o, f"ort {tag} qdq {x_type}", preset, x)
            for out, shape_input in ((0, False), (2, True), (1, False)):
                dequantize(o, f"ort {tag} dequantize {out}", preset, shape, want, out, shape_input)


def qdq(o: OrtRun, name: str, dt: str, x: np.ndarray, runs: int = 1, axis: int = -1) -> None:
    """QuantizeDequantizeMX (the fused activation cast): Y, of X's type, the reference's."""
    node = helper.make_node(
        "QuantizeDequantizeMX", ["x"], ["y"], name, domain="onnxq", dtype=dt, axis=axis
    )
    y = np.zeros(x.shape, x.dtype)
    if o.run(name, [node], {"x": _registered(x)}, {}, {"y": y}, runs):
        o.r.check(name, y, onnxq.cast(x, dt, backend="reference", axis=axis))


def inner_axis(o: OrtRun) -> None:
    """Tiles along axis 1 of an NCHW-like X (elements after the axis): QuantizeMX,
    QuantizeDequantizeMX and DequantizeMX (its Shape input: the axis's place known at Run)."""
    shape = (2, 40, 3)
    for i, preset in enumerate(("mxfp4", "mx6", "nvfp4")):
        x = _input(shape, 110 + i)
        want = onnxq.cast(x, preset, mode="compress", backend="reference", axis=1)
        fields = _fields(want)
        outs = {n: np.zeros(a.shape, a.dtype) for n, a in fields.items()}
        names = [n if n in fields else "" for n in Q_OUTPUTS]
        name = f"ort axis 1 {preset} quantize"
        node = helper.make_node("QuantizeMX", ["x"], names, domain="onnxq", dtype=preset, axis=1)
        if o.run(name, [node], {"x": _registered(x)}, {}, outs):
            if not all(np.array_equal(outs[n], fields[n]) for n in fields):
                o.r.bad.append(name)
        qdq(o, f"ort axis 1 {preset} qdq", preset, x, axis=1)
        dequantize(o, f"ort axis 1 {preset} dequantize", preset, shape, want, 0, True, axis=1)


def _fields(q: Any) -> dict[str, np.ndarray]:
    """QuantizeMX's outputs as the reference's compress layout has them (docs/ops.md)."""
    fields = {"q": q.data, "scale": q.scale}
    if q.tenscale is not None:
        fields["tenscale"] = np.asarray(q.tenscale).reshape(1).view(np.uint32)
    if q.meta is not None:
        fields["meta"] = q.meta
    return {n: np.ascontiguousarray(a) for n, a in fields.items()}


def dequantize(
    o: OrtRun,
    name: str,
    dt: str,
    shape: tuple[int, ...],
    q: Any,
    out: int,
    shape_input: bool,
    axis: int = -1,
    runs: int = 1,
) -> None:
    fields = _fields(q)
    names = [n if n in fields else "" for n in Q_OUTPUTS]
    attrs: dict[str, Any] = dict(dtype=dt, output_type=ONNX_OUT[out], axis=axis)
    host = {}
    if shape_input:
        names.append("shape")
        host["shape"] = np.asarray(shape, np.int64)
    else:
        attrs["shape"] = list(shape)
    node = helper.make_node("DequantizeMX", names, ["y"], name, domain="onnxq", **attrs)
    y = np.zeros(shape, NP_OUT[out])
    device = {n: _registered(a) for n, a in fields.items()}
    if o.run(name, [node], device, host, {"y": y}, runs):
        o.r.check(name, y, onnxq.upcast(q, NP_OUT[out]))


def lookups(o: OrtRun) -> None:
    """CodebookLookup: implicit codebooks (a few kinds of block) and a generic one whose table
    is the Table input, in host memory."""
    cases = [(code, code, shape, out, False) for code, shape, out in LOOKUPS[1:4]]
    cases += [(g, i, shape, out, True) for g, i, shape, out in GENERIC]
    for n, (dtype, implicit, shape, out, generic) in enumerate(cases):
        q = onnxq.cast(_input(shape, 90 + n), implicit, mode="compress", backend="reference")
        table = np.asarray(datatype(implicit).nspec.table(), np.float32) if generic else None
        lookup(o, f"ort lookup {dtype}", dtype, shape, q, out, table)
    # tiles along axis 0 (a MatMul weight's K), the blocks' LAST=False compile
    code, shape = "cb41fi_e2m2fnuz_e8m0_t32s8", (64, 6)
    q = onnxq.cast(_input(shape, 97), code, mode="compress", backend="reference", axis=0)
    lookup(o, f"ort lookup axis 0 {code}", code, shape, q, 0, axis=0)


def lookup(
    o: OrtRun,
    name: str,
    dtype: str,
    shape: tuple[int, ...],
    q: Any,
    out: int,
    table: np.ndarray | None = None,
    runs: int = 1,
    axis: int = -1,
) -> None:
    """One CodebookLookup node (a generic codebook's `table` as its Table input)."""
    device = {"q": _registered(q.data), "scale": _registered(q.scale)}
    if q.meta is not None:
        device["meta"] = _registered(q.meta)
    host = {}
    inputs = ["q", "meta" if q.meta is not None else "", "scale"]
    if table is not None:
        host["table"] = table
        inputs.append("table")
    node = helper.make_node(
        "CodebookLookup", inputs, ["y"], name, domain="onnxq", dtype=dtype, shape=list(shape),
        output_type=ONNX_OUT[out], axis=axis,
    )  # fmt: skip
    y = np.zeros(shape, NP_OUT[out])
    if o.run(name, [node], device, host, {"y": y}, runs):
        o.r.check(name, y, onnxq.upcast(q, NP_OUT[out]))


# (case, QuantizeMX attributes, the reference's cast arguments): nodes the device kernels
# cannot run (2-D tiles, a codebook, stochastic rounding)
HOST_QUANTIZE = [
    ("host 2-d tiles", dict(dtype="int8_e8m0_t8_t4"), dict()),
    ("host codebook quantize", dict(dtype="cb41fi_e2m2fnuz_e8m0_t32"), dict()),
    (
        "host stochastic",
        dict(dtype="mxfp8e4", round_mode="stochastic", seed=5),
        dict(round_mode="stochastic", seed=5),
    ),
]
# (dtype, QuantizeMX's mode attributes): modes the general kernels take at run time
MODE_NODES = [
    ("mxfp8e4", dict(round_mode="away", scale_mode="ceil")),
    ("mxfp4", dict(round_mode="zero", scale_mode="midmax", nan_policy="block")),
    ("mxint8", dict(int_range="full")),
    ("mx6", dict(round_mode="away", nan_policy="block", int_range="full")),
    ("nvfp4", dict(round_mode="zero")),
]


def modes(o: OrtRun) -> None:
    """Nodes with modes other than the defaults run on the general kernels (last axis a
    multiple of the tile: the fast kernel would take the default modes), QuantizeMX and
    QuantizeDequantizeMX, the reference's bits."""
    for i, (dt, attrs) in enumerate(MODE_NODES):
        x = _input((4, 64), 120 + i)
        want = onnxq.cast(x, dt, mode="compress", backend="reference", **attrs)
        fields = _fields(want)
        outs = {n: np.zeros(a.shape, a.dtype) for n, a in fields.items()}
        names = [n if n in fields else "" for n in Q_OUTPUTS]
        name = f"ort modes {dt} quantize"
        node = helper.make_node("QuantizeMX", ["x"], names, domain="onnxq", dtype=dt, **attrs)
        if o.run(name, [node], {"x": _registered(x)}, {}, outs):
            if not all(np.array_equal(outs[n], fields[n]) for n in fields):
                o.r.bad.append(name)
        name = f"ort modes {dt} qdq"
        node = helper.make_node(
            "QuantizeDequantizeMX", ["x"], ["y"], domain="onnxq", dtype=dt, **attrs
        )
        y = np.zeros(x.shape, x.dtype)
        if o.run(name, [node], {"x": _registered(x)}, {}, {"y": y}):
            o.r.check(name, y, onnxq.cast(x, dt, backend="reference", **attrs))
    # a dtype attribute naming an embedded format by another preset name
    qdq(o, "ort alias mxfp8 qdq", "mxfp8", _input((4, 64), 130))
    # ... and by another spelling of its code, whitespace around it
    qdq(o, "ort spelled e4m3 qdq", "\n E4M3_E8M0_T32 ", _input((4, 64), 131))


def host_fallback(o: OrtRun) -> None:
    """Nodes the device kernels cannot run take the CPU kernel on host copies: the results
    are the reference's, and the copies and synchronisations show in the driver's counts."""
    shape = (4, 64)
    x = _input(shape, 7)
    for name, attrs, cast_args in HOST_QUANTIZE:
        want = onnxq.cast(x, attrs["dtype"], mode="compress", backend="reference", **cast_args)
        fields = _fields(want)
        outs = {n: np.zeros(a.shape, a.dtype) for n, a in fields.items()}
        names = [n if n in fields else "" for n in Q_OUTPUTS]
        node = helper.make_node("QuantizeMX", ["x"], names, name, domain="onnxq", **attrs)
        if o.run(name, [node], {"x": _registered(x)}, {}, outs, runs=2):
            if not all(np.array_equal(outs[n], fields[n]) for n in fields):
                o.r.bad.append(name)
    qdq(o, "host qdq 2-d tiles", "int8_e8m0_t8_t4", x, runs=2)
    q = onnxq.cast(x, "int8_e8m0_t8_t4", mode="compress", backend="reference")
    dequantize(o, "host dequantize 2-d tiles", "int8_e8m0_t8_t4", shape, q, 2, False, runs=2)
    for code in ("cb41fi_e2m2fnuz_e8m0_t4_t8", "cb41fi_e2m2fnuz_e8m0_t128s64"):
        q = onnxq.cast(x, code, mode="compress", backend="reference")
        lookup(o, f"host lookup {code}", code, shape, q, 0, runs=2)


# GatherMX: (dtype, table shape, tile axis) on the device (the rows' packed codes, scales and
# meta bits copied out by the row-copy kernel, then decoded): 4-bit codes, rows of 33 codes
# (132 bits: rows that do not start on a byte), MX shift bits, NVFP4's tensor scale, 8-bit
# codes with a ragged last tile (70 = 2 * 32 + 6), tiles along axis 1 with elements after it,
# an implicit codebook with meta bits
GATHERS = [
    ("mxfp4", (10, 64), -1),
    ("mxfp4", (6, 33), -1),
    ("mx6", (9, 2, 20), -1),
    ("nvfp4", (7, 48), -1),
    ("mxfp8e4", (6, 70), -1),
    ("mxfp4", (5, 64, 3), 1),
    ("cb41fi_e2m2fnuz_e8m0_t32s8", (8, 64), -1),
]
# ... and on the host fallback: tiles along the rows (axis 0), a format without kernels
HOST_GATHERS = [
    ("mxfp4", (64, 6), 0),
    ("int8_channel", (6, 16), -1),
]
GATHER_SLOTS = ("q", "scale", "zero", "tenscale", "meta", "mask")


def gather(
    o: OrtRun,
    name: str,
    dt: str,
    shape: tuple[int, ...],
    axis: int,
    out: int,
    idx: np.ndarray,
    runs: int = 1,
    implicit: str = "",
) -> None:
    """One GatherMX node over a packed table in device memory (Indices, and a generic
    codebook's Table from the `implicit` one, on the host as on the CUDA provider): Y is the
    reference decode of the table's rows `idx`."""
    # each row a magnitude of its own, so that a row decoded with another row's scales shows;
    # NaN and infinities in row 0 only (a codebook tile with one decodes to NaN)
    x = _input(shape, 140 + len(name))
    x[1:] = np.nan_to_num(x[1:], nan=1.0, posinf=3.0, neginf=-3.0)
    x *= np.exp2(3.0 * (np.arange(shape[0]) % 8) - 8, dtype=np.float32).reshape(
        -1, *[1] * (len(shape) - 1)
    )
    q = onnxq.cast(x, implicit or dt, mode="compress", backend="reference", axis=axis)
    fields = {n: a for n, a in _fields(q).items() if n in GATHER_SLOTS}
    names = ["idx"] + [n if n in fields else "" for n in GATHER_SLOTS]
    host = {"idx": idx}
    if implicit:
        names.append("table")
        host["table"] = np.asarray(datatype(implicit).nspec.table(), np.float32)
    node = helper.make_node(
        "GatherMX", names, ["y"], name, domain="onnxq", dtype=dt, shape=list(shape), axis=axis,
        output_type=ONNX_OUT[out],
    )  # fmt: skip
    y = np.zeros(idx.shape + shape[1:], NP_OUT[out])
    device = {n: _registered(a) for n, a in fields.items()}
    if o.run(name, [node], device, host, {"y": y}, runs):
        o.r.check(name, y, np.take(onnxq.upcast(q, NP_OUT[out]), idx, axis=0))


def gathers(o: OrtRun) -> None:
    """GatherMX on the device: negative and repeated indices, int64 and int32, 2-D indices,
    three output types; a generic codebook with its Table; the host fallback's cases."""
    idx = np.asarray([[3, -1, 0], [3, 4, 2]], np.int64)
    for i, (dt, shape, axis) in enumerate(GATHERS):
        out = i % 3
        ix = idx if i % 2 else idx.astype(np.int32)
        gather(o, f"ort gather {dt} {shape} axis {axis} {out}", dt, shape, axis, out, ix)
    # a generic codebook, its table the Table input; a row's 3 meta units are 3 bits
    gather(o, "ort gather generic", "cb41_e2m2fnuz_e8m0_t32", (6, 96), -1, 1, idx,
           implicit="cb41fi_e2m2fnuz_e8m0_t32")  # fmt: skip
    gather(o, "ort gather no rows", "mxfp4", (10, 64), -1, 0, np.zeros((0, 2), np.int64))
    for dt, shape, axis in HOST_GATHERS:
        gather(o, f"host gather {dt} {shape} axis {axis}", dt, shape, axis, 0, idx, runs=2)
    bad = np.asarray([1, 6], np.int64)  # a table of 6 rows: refused before any launch
    gather(o, "ort gather out of range", "mxfp4", (6, 64), -1, 0, bad)


def odd_name(o: OrtRun) -> None:
    """A node name with a line break and 300 characters: the warning stays one short line."""
    x = _input((4, 64), 8)
    node = helper.make_node(
        "QuantizeDequantizeMX", ["x"], ["y"], "a\nb" + "c" * 300, domain="onnxq",
        dtype="int8_e8m0_t8_t4",
    )  # fmt: skip
    y = np.zeros(x.shape, x.dtype)
    if o.run("host odd name", [node], {"x": _registered(x)}, {}, {"y": y}):
        o.r.check("host odd name", y, onnxq.cast(x, "int8_e8m0_t8_t4", backend="reference"))


def empty(o: OrtRun) -> None:
    """An empty X: the outputs an X of its shape gives (the CPU op's), nothing launched."""
    node = helper.make_node("QuantizeMX", ["x"], ["q", "scale", "", "ts"], domain="onnxq",
                            dtype="nvfp4")  # fmt: skip
    outs = {"q": np.zeros(0, np.uint8), "scale": np.zeros((0, 4), np.uint8)}
    outs["ts"] = np.full(1, 7, np.uint32)  # the op writes code 0 there
    if o.run("empty x", [node], {"x": np.zeros((0, 64), np.float32)}, {}, outs):
        if outs["ts"][0] != 0:
            o.r.bad.append("empty x")


def strict(o: OrtRun) -> None:
    """ONNXQ_CUDA_HOST_FALLBACK=0: the same nodes are refused, at session creation where the
    attributes tell, else at Run."""
    x = _registered(_input((4, 64), 7))
    os.environ["ONNXQ_CUDA_HOST_FALLBACK"] = "0"  # read when each kernel is made
    try:
        for name, attrs, _ in HOST_QUANTIZE:
            node = helper.make_node("QuantizeMX", ["x"], ["q", "scale"], domain="onnxq", **attrs)
            outs = {"q": np.zeros(256, np.uint8), "scale": np.zeros((4, 2), np.uint8)}
            o.run(name.replace("host", "strict"), [node], {"x": x}, {}, outs)
    finally:
        del os.environ["ONNXQ_CUDA_HOST_FALLBACK"]


def main() -> None:
    o = OrtRun()
    quantize_dequantize(o)
    inner_axis(o)
    lookups(o)
    modes(o)
    host_fallback(o)
    gathers(o)
    odd_name(o)
    empty(o)
    strict(o)
    r = o.r
    result = dict(bad=r.bad, refused=r.refused, launches=r.launches, errors=r.emu.errors)
    print(json.dumps(dict(result, copies=o.copies, sizes=o.sizes)))


if __name__ == "__main__":
    main()
