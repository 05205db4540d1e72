"""A real model through the CUDA execution provider's kernels on the CPU: the case that
`test_cuda_emulated` checks.

The model is quantized as ``onnxq quantize`` does it and run in a session where the onnxq
nodes take the CUDA provider's kernels (``ONNXQ_CUDA_OPS_ON_CPU_PROVIDER=1``, `run_emulated_ort`)
on the fake driver, with `fake_ort_allocator.c` as onnxruntime's allocator so that every
intermediate tensor lives in memory the driver counts as device memory: the launches run in
Triton's interpreter on the model's own activations (dynamic batch and sequence dims), and the
weights (onnxruntime's initializers, outside the driver's blocks; ``fake_any_memory``) take
the host fallback where their axis needs it. With ``packed_inputs`` the onnxq nodes' packed
weights are graph inputs fed from the driver's blocks instead, so that GatherMX and
DequantizeMX launch on them. Weights are decoded at each run (``decode_weights="run"``), as
on the CUDA provider.

Run as a script with ``TRITON_INTERPRET=1``, ``ONNXQ_LIBCUDA``,
``ONNXQ_CUDA_OPS_ON_CPU_PROVIDER=1``; argument: a JSON object with ``model``, ``weights``,
``activations`` (or ``preset`` and ``block_size``: a deployment recipe), ``fuse``,
``weight_storage``, ``modes`` (a recipe's mode keys), ``recipe`` (more recipe keys) and
``packed_inputs`` (all four optional), ``allocator`` (the
built allocator library) and ``want`` (an .npz of the CPU provider's outputs). Prints one
JSON object: ``same`` (each output equal bit for bit), ``kernels`` (the kernels launched),
``errors`` (exceptions in the launch callback).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # tests.models
import onnxq

_ = onnxq.cast
from run_emulated import Run  # noqa: E402

from onnxq import runtime  # noqa: E402
from tests.models.real import example_inputs, model_path  # noqa: E402


def quantized(case: dict) -> object:
    """The model as `onnxq quantize` writes it for the case (shared with the test)."""
    if "preset" in case:  # `onnxq quantize --preset NAME [--block-size N]`
        from onnxq.graph.recipe import deployment_recipe

        recipe = deployment_recipe(case["preset"], case.get("block_size"))
    else:
        recipe = {
            "weights": case["weights"],
            "activations": case["activations"],
            **case.get("modes", {}),
            "custom_ops_only": "modes" in case,  # modes without a standard-ONNX fallback
            **case.get("recipe", {}),  # more recipe keys (op_type_overrides...)
        }
    return onnxq.quantize_model(
        str(model_path(case["model"])),
        recipe=recipe,
        fuse=case["fuse"],
        weight_storage=case.get("weight_storage", "packed"),
    )


def packed_as_inputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model with the onnxq nodes' integer initializers (packed codes, scales, meta) as
    graph inputs, and their values to feed."""
    used = {name for node in model.graph.node if node.domain == "onnxq" for name in node.input}
    ints = (onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32)
    feeds = {}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.initializer[:]
    for t in model.graph.initializer:
        if t.name in used and t.data_type in ints:
            feeds[t.name] = np.ascontiguousarray(numpy_helper.to_array(t))
            out.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, t.dims))
        else:
            out.graph.initializer.append(t)
    return out, feeds


def main() -> None:
    case = json.loads(sys.argv[1])
    r = Run()
    r.emu.lib.fake_any_memory(1)
    options = ort.SessionOptions()
    options.log_severity_level = 2  # the host fallback's warnings (stderr)
    options.register_custom_ops_library(case["allocator"])
    options.add_session_config_entry("session.use_env_allocators", "1")
    model, packed = quantized(case), {}
    if case.get("packed_inputs"):
        model, packed = packed_as_inputs(model)
    sess = runtime.session(
        model, providers=["CPUExecutionProvider"], sess_options=options, decode_weights="run"
    )
    feeds = {k: np.ascontiguousarray(v) for k, v in example_inputs(case["model"]).items()}
    feeds.update(packed)
    for v in feeds.values():
        r.dev(v)
    # copies: onnxruntime's own output arrays must go while the session lives (their buffers
    # return to the session's allocator when they are freed)
    outs = [np.array(o, copy=True) for o in sess.run(None, feeds)]
    want = np.load(case["want"])
    same = [
        bool(np.array_equal(o.view(np.uint8), want[f"arr_{i}"].view(np.uint8)))
        for i, o in enumerate(outs)
    ]
    print(json.dumps(dict(same=same, kernels=r.emu.log, errors=r.emu.errors)), flush=True)


if __name__ == "__main__":
    main()
