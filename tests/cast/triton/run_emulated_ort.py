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

import json
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
        self.options.log_severity_level = 3

    def run(
        self,
        name: str,
        nodes: list[Any],
        device: dict[str, np.ndarray],
        host: dict[str, np.ndarray],
        outputs: dict[str, np.ndarray],
    ) -> bool:
        """Runs the graph with `device` inputs and `outputs` in registered buffers, `host`
        inputs in plain memory; False (the message in `refused`) when onnxruntime refuses."""
        elem = {np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16}
        types = {
            n: elem.get(a.dtype) or helper.np_dtype_to_tensor_dtype(a.dtype)
            for n, a in outputs.items()
        }
        first = len(self.r.emu.log)
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
            sess.run_with_iobinding(binding)
            return True
        except Exception as err:  # onnxruntime raises its own exception types
            self.r.refused[name] = str(err)
            return False
        finally:
            self.r.launches[name] = self.r.emu.log[first:]


def _ortvalue(a: np.ndarray) -> Any:
    """An OrtValue over the array's own memory (onnxruntime types bfloat16 from uint16 bits)."""
    if a.dtype == ml_dtypes.bfloat16:
        v = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(np.uint16), ONNX_OUT[2])
    else:
        v = ort.OrtValue.ortvalue_from_numpy(a)
    if v.data_ptr() != a.ctypes.data:
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
            for out, shape_input in ((0, False), (2, True), (1, False)):
                dequantize(o, f"ort {tag} dequantize {out}", preset, shape, want, out, shape_input)


def _fields(q: Any) -> dict[str, np.ndarray]:
    """QuantizeMX's outputs as the reference's compress layout has them (docs/ops.md)."""
    fields = {"q": q.data, "scale": q.scale}
    if q.tenscale is not None:
        fields["tenscale"] = np.asarray(q.tenscale).reshape(1).view(np.uint32)
    if q.meta is not None:
        fields["meta"] = q.meta
    return {n: np.ascontiguousarray(a) for n, a in fields.items()}


def dequantize(
    o: OrtRun, name: str, dt: str, shape: tuple[int, ...], q: Any, out: int, shape_input: bool
) -> None:
    fields = _fields(q)
    names = [n if n in fields else "" for n in Q_OUTPUTS]
    attrs: dict[str, Any] = dict(dtype=dt, output_type=ONNX_OUT[out])
    host = {}
    if shape_input:
        names.append("shape")
        host["shape"] = np.asarray(shape, np.int64)
    else:
        attrs["shape"] = list(shape)
    node = helper.make_node("DequantizeMX", names, ["y"], domain="onnxq", **attrs)
    y = np.zeros(shape, NP_OUT[out])
    device = {n: _registered(a) for n, a in fields.items()}
    if o.run(name, [node], device, host, {"y": y}):
        o.r.check(name, y, onnxq.upcast(q, NP_OUT[out]))


def lookups(o: OrtRun) -> None:
    """CodebookLookup: implicit codebooks (a few kinds of block) and a generic one whose table
    is the Table input, in host memory."""
    cases = [(code, code, shape, out, False) for code, shape, out in LOOKUPS[1:4]]
    cases += [(g, i, shape, out, True) for g, i, shape, out in GENERIC]
    for n, (dtype, implicit, shape, out, generic) in enumerate(cases):
        q = onnxq.cast(_input(shape, 90 + n), implicit, mode="compress", backend="reference")
        device = {"q": _registered(q.data), "scale": _registered(q.scale)}
        if q.meta is not None:
            device["meta"] = _registered(q.meta)
        host = {}
        inputs = ["q", "meta" if q.meta is not None else "", "scale"]
        if generic:
            host["table"] = np.asarray(datatype(implicit).nspec.table(), np.float32)
            inputs.append("table")
        node = helper.make_node(
            "CodebookLookup", inputs, ["y"], domain="onnxq", dtype=dtype, shape=list(shape),
            output_type=ONNX_OUT[out],
        )  # fmt: skip
        y = np.zeros(shape, NP_OUT[out])
        name = f"ort lookup {dtype}"
        if o.run(name, [node], device, host, {"y": y}):
            o.r.check(name, y, onnxq.upcast(q, NP_OUT[out]))


def refusals(o: OrtRun) -> None:
    """What the CUDA kernels cannot run is refused when the session is made, before a launch."""
    x = _registered(_input((4, 64), 7))
    for name, attrs in (
        ("ort 2-d tiles", dict(dtype="int8_e8m0_t8_t4")),
        ("ort axis 0", dict(dtype="mxfp8e4", axis=0)),
        ("ort round away", dict(dtype="mxfp8e4", round_mode="away")),
        ("ort codebook quantize", dict(dtype="cb41fi_e2m2fnuz_e8m0_t32")),
    ):
        node = helper.make_node("QuantizeMX", ["x"], ["q", "scale"], domain="onnxq", **attrs)
        outs = {"q": np.zeros(256, np.uint8), "scale": np.zeros((4, 2), np.uint8)}
        o.run(name, [node], {"x": x}, {}, outs)


def main() -> None:
    o = OrtRun()
    quantize_dequantize(o)
    lookups(o)
    refusals(o)
    r = o.r
    print(json.dumps(dict(bad=r.bad, refused=r.refused, launches=r.launches, errors=r.emu.errors)))


if __name__ == "__main__":
    main()
