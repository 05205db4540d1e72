"""onnxq across the onnx releases pyproject.toml allows (onnx>=1.16).

onnx 1.19+ lets a schema carry a Python shape-inference function, but its schema registry is a
C++ static destroyed after the interpreter: a process that registered the onnxq schemas hung
(1.19) or crashed with SIGSEGV, status 139 (1.20-1.22) at exit, and onnx 1.16-1.18 cannot take
the function at all (``import onnxq.graph`` failed). These tests run real processes and check
their exit status and that they finish, and check that the inference onnxq does itself on
releases without Python inference functions (`schemas._propagate`) types the onnxq outputs
exactly as the schemas' inference function does. .ci/oldest runs this file with the oldest
releases pyproject.toml allows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
import pytest

from onnxq import runtime
from onnxq.graph import schemas
from onnxq.graph.quantize import quantize_model
from tests.models import builders

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 180  # a process that hangs at exit fails here instead of stalling the suite


def _python(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the process did not finish in {TIMEOUT} s (hung at exit?): {code!r}")


_SESSION = """
import numpy as np, onnx
from tests.models import builders
from onnxq import runtime
from onnxq.graph.quantize import quantize_model
from onnxq.graph.schemas import infer_shapes

model, feeds = builders.mlp()
q = quantize_model(model, weights="mxfp4", activations="mxfp8e4")
infer_shapes(q)
if runtime.has_custom_ops():
    print(runtime.session(q).run(None, feeds)[0].shape)
"""

SCRIPTS = {  # name -> (script, expected exit status)
    "import": ("import onnxq.graph", 0),
    "register": ("from onnxq.graph import register_schemas\nregister_schemas()", 0),
    "session": (_SESSION, 0),
    "error after registering": (
        "from onnxq.graph import register_schemas\nregister_schemas()\nraise SystemExit(3)",
        3,
    ),
    "exception after registering": (
        "from onnxq.graph import register_schemas\nregister_schemas()\nraise ValueError('x')",
        1,
    ),
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_processes_using_the_schemas_exit_cleanly(name: str, tmp_path: Path) -> None:
    script, status = SCRIPTS[name]
    done = _python(script, cwd=tmp_path)
    assert done.returncode == status, (done.returncode, done.stderr[-2000:])


def test_cli_processes_exit_cleanly(tmp_path: Path) -> None:
    model, _ = builders.mlp()
    onnx.save(model, str(tmp_path / "f.onnx"))
    cli = "import sys\nfrom onnxq.cli import main\nsys.exit(main(sys.argv[1:]))"
    steps = [
        (["quantize", "f.onnx", "-o", "q.onnx", "--weights", "mxfp4", "--activations", "mx6"], 0),
        (["run", "q.onnx"], 0),
        (["compare", "f.onnx", "q.onnx"], 0),
        (["inspect", "q.onnx"], 0),
        (["run", "missing.onnx"], 2),
        (["quantize", "f.onnx", "-o", "x.onnx", "--weights", "nosuch"], 2),
    ]
    for argv, status in steps:
        done = _python(cli, *argv, cwd=tmp_path)
        assert done.returncode == status, (argv, done.returncode, done.stderr[-2000:])


# -- onnxq's own inference on releases without Python inference functions -----------------------
_FALLBACK = """
import sys
import numpy as np, onnx
from onnxq.graph import schemas
schemas._PY_INFERENCE = False  # as on onnx 1.16-1.18: the schemas carry no inference function
from onnxq import runtime

model = onnx.load(sys.argv[1])
onnx.save(schemas.infer_shapes(model), sys.argv[2])
assert not onnx.defs.get_schema("QuantizeMX", 1, "onnxq").has_type_and_shape_inference_function
if runtime.has_custom_ops():
    feeds = dict(np.load(sys.argv[3]))
    np.savez(sys.argv[4], *runtime.session(model).run(None, feeds))
"""


def _types(model: onnx.ModelProto) -> dict[str, tuple[int, tuple[int | str, ...] | None]]:
    out = {}
    for v in (*model.graph.value_info, *model.graph.output):
        t = v.type.tensor_type
        dims = (
            tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim)
            if t.HasField("shape")
            else None
        )
        out[v.name] = (t.elem_type, dims)
    return out


CASES = {
    "mlp mxfp4/mxfp8e4": (builders.mlp, {"weights": "mxfp4", "activations": "mxfp8e4"}),
    "transformer mx6 packed": (
        builders.transformer,
        {"weights": "mx6", "activations": "mx6", "weight_storage": "packed"},
    ),
    "cnn nvfp4 packed": (
        builders.cnn,
        {"weights": "nvfp4", "activations": "bfp16", "weight_storage": "packed"},
    ),
    "mlp sparse": (builders.mlp, {"weights": "e2m1fnuz_e8m0_t32n2m4", "activations": "mxint8"}),
    "mlp codebook": (builders.mlp, {"weights": "cb41fi_e2m2fnuz_e8m0_t32"}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_own_inference_types_onnxq_outputs_like_the_schemas(case: str, tmp_path: Path) -> None:
    build, options = CASES[case]
    model, feeds = build()
    q = quantize_model(model, **options)
    onnxq_outputs = {o for n in q.graph.node if n.domain == schemas.DOMAIN for o in n.output if o}
    assert onnxq_outputs, "the case must hold onnxq nodes"
    onnx.save(q, str(tmp_path / "q.onnx"))
    np.savez(tmp_path / "feeds.npz", **feeds)
    done = _python(_FALLBACK, "q.onnx", "inferred.onnx", "feeds.npz", "out.npz", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    fallback = _types(onnx.load(str(tmp_path / "inferred.onnx")))
    typed = {name for name, (elem, _) in fallback.items() if elem}
    assert onnxq_outputs - typed <= _unused_outputs(q), "an onnxq output was left untyped"
    if schemas._PY_INFERENCE:  # on onnx 1.19+ the schemas' inference function is the reference
        assert fallback == _types(onnx.shape_inference.infer_shapes(q))
    if runtime.has_custom_ops():
        got = np.load(tmp_path / "out.npz")
        expected = runtime.session(q).run(None, feeds)
        for i, e in enumerate(expected):
            assert np.array_equal(got[f"arr_{i}"], e, equal_nan=True)


def _unused_outputs(model: onnx.ModelProto) -> set[str]:
    """Outputs of onnxq nodes that the data type does not have (type 0: never typed)."""
    unused = set()
    for node in model.graph.node:
        if node.domain != schemas.DOMAIN:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
        types = schemas.output_types(node.op_type, attrs)
        for name, (elem, _) in zip(node.output, types[: len(node.output)], strict=True):
            if not elem:
                unused.add(name)
    return unused


# -- fallbacks use only ops that onnxruntime>=1.20 implements --------------------------------------
_BITSHIFT_TYPES = {onnx.TensorProto.UINT8, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64}


@pytest.mark.parametrize("options", [
    {"weights": "mxfp4", "activations": "mxfp6e2", "weight_storage": "packed"},
    {"weights": "mx6", "activations": "mxint8", "weight_storage": "packed"},
    {"weights": "e8m7_e8m0_t32", "activations": "bfp16", "weight_storage": "packed"},
])  # fmt: skip
def test_fallback_bitshifts_use_types_old_onnxruntime_implements(options: dict) -> None:
    """onnxruntime has BitShift kernels for uint8/32/64 only (uint16 since late 2026)."""
    model, _ = builders.mlp()
    q = quantize_model(model, **options)
    assert q.functions, "the case must embed function fallbacks"
    inlined = onnx.shape_inference.infer_shapes(onnx.inliner.inline_local_functions(q))
    types = {v.name: v.type.tensor_type.elem_type for v in inlined.graph.value_info}
    types.update({t.name: t.data_type for t in inlined.graph.initializer})
    for node in inlined.graph.node:
        for attr in node.attribute:
            if attr.name == "value" and node.op_type == "Constant":
                types[node.output[0]] = attr.t.data_type
    shifts = [n for n in inlined.graph.node if n.op_type == "BitShift"]
    assert shifts, "the case must unpack codes with BitShift"
    for node in shifts:
        assert {types.get(i) for i in node.input} <= _BITSHIFT_TYPES, node
