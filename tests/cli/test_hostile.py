"""The `onnxq` command as a real subprocess over many bad inputs (every subcommand).

Each case runs ``python -m onnxq ...`` and must end with exit status 2 and exactly one line on
stderr (no traceback) and no output file, or with 0 on success; never a signal (139 is the
SIGSEGV an interpreter dying at exit would give). The input files are hashed before and after:
no command may change them. Cases are chosen to cover each kind of bad input once per
command (about 1 s per subprocess; ``-n 2`` halves the wall time).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxq

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120


# -- the input files ---------------------------------------------------------------------------
def _tiny() -> onnx.ModelProto:
    """x[N,64] -> MatMul(w1 64x32) -> Relu -> MatMul(w2 32x10) -> Softmax -> probs."""
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((64, 32)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((32, 10)) * 0.2).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        helper.make_node("Relu", ["h0"], ["h1"], name="relu"),
        helper.make_node("MatMul", ["h1", "w2"], ["logits"], name="fc2"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _static() -> onnx.ModelProto:
    """The tiny model with a static batch of 2 (activations can be quantized)."""
    model = _tiny()
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = 2
    return model


def _relu_only() -> onnx.ModelProto:
    """A model with no op the quantizer targets."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _foreign_op() -> onnx.ModelProto:
    """A node of a domain nobody registered: valid protobuf, not runnable."""
    model = _relu_only()
    model.graph.node[0].domain = "com.example"
    model.graph.node[0].op_type = "Mystery"
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    return model


def _dangling() -> onnx.ModelProto:
    """A node reading a tensor nothing defines."""
    model = _relu_only()
    model.graph.node[0].input[0] = "nowhere"
    return model


def _dq_node(**attrs: object) -> onnx.ModelProto:
    """An onnxq DequantizeMX node with the given attributes, reading a stored q."""
    q = numpy_helper.from_array(np.zeros(16, np.uint8), "q")
    scale = numpy_helper.from_array(np.full(1, 127, np.uint8), "s")
    node = helper.make_node("DequantizeMX", ["q", "s"], ["w"], name="dq", domain="onnxq", **attrs)
    graph = helper.make_graph(
        [node],
        "dq",
        [],
        [helper.make_tensor_value_info("w", TensorProto.FLOAT, None)],
        [q, scale],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    model.ir_version = 10
    return model


def _npz(path: Path, **arrays: object) -> None:
    with open(path, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def ins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of good and bad inputs (read-only for every case)."""
    d = tmp_path_factory.mktemp("hostile_inputs")
    for name, model in (
        ("tiny", _tiny()),
        ("static", _static()),
        ("relu", _relu_only()),
        ("foreign", _foreign_op()),
        ("dangling", _dangling()),
    ):
        onnx.save(model, str(d / f"{name}.onnx"))
    broken = {
        "dq_type": _dq_node(dtype="mxfp4", axis=-1, shape=[16], output_type=999),
        "dq_fmt": _dq_node(dtype="no_such_format", axis=-1, shape=[16]),
        "dq_nodtype": _dq_node(axis=-1, shape=[16]),
        "dq_huge": _dq_node(dtype="mxfp4", axis=-1, shape=[2**40, 2**40]),
    }
    short = _tiny()
    short.graph.initializer[0].raw_data = short.graph.initializer[0].raw_data[:100]
    mismatch = _tiny()
    mismatch.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 63
    type999 = _tiny()
    type999.graph.initializer[0].data_type = 999
    broken.update(short=short, mismatch=mismatch, type999=type999)
    for name, model in broken.items():
        onnx.save(model, str(d / f"{name}.onnx"))
    onnxq.quantize_model(str(d / "tiny.onnx"), str(d / "q.onnx"), weights="mxfp4")
    onnxq.quantize_model(
        str(d / "tiny.onnx"), str(d / "fake.onnx"), weights="mxfp4", weight_storage="fake"
    )
    onnxq.quantize_model(
        str(d / "tiny.onnx"), str(d / "std.onnx"), weights="mxint8", target="standard"
    )
    onnxq.quantize_model(
        str(d / "tiny.onnx"), str(d / "cb.onnx"), weights="cb41fi_e2m2fnuz_e8m0_t32"
    )
    onnx.save(
        _tiny(),
        str(d / "ext.onnx"),
        save_as_external_data=True,
        location="ext.onnx.data",
        size_threshold=0,
    )
    tiny = (d / "tiny.onnx").read_bytes()
    (d / "truncated.onnx").write_bytes(tiny[: len(tiny) // 2])
    (d / "empty.onnx").write_bytes(b"")
    (d / "garbage.onnx").write_bytes(bytes(range(256)) * 4)
    (d / "text.onnx").write_text("this is not a model\n")
    (d / "a_dir").mkdir()
    (d / "full_dir").mkdir()
    (d / "full_dir" / "keep.txt").write_text("keep")
    (d / "a_file").write_text("a file")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    _npz(d / "good.npz", x=x)
    _npz(d / "names.npz", y=x)
    _npz(d / "extra.npz", x=x, y=x)
    _npz(d / "strings.npz", x=np.array(["a", "b"]))
    _npz(d / "shape.npz", x=np.zeros((2, 63), np.float32))
    _npz(d / "int.npz", x=np.ones((2, 64), np.int64))
    with open(d / "pickled.npz", "wb") as f:
        np.savez(f, x=np.array([{"a": 1}], dtype=object))
    (d / "pickle.npz").write_bytes(pickle.dumps({"x": x}))
    (d / "garbage.npz").write_bytes(b"PK\x03\x04" + bytes(100))
    (d / "calib").mkdir()
    (d / "calib_bad").mkdir()
    (d / "calib_bad" / "s.npz").write_bytes(b"not an npz")
    recipes = {
        "binary.yaml": bytes(range(256)),
        "empty.yaml": b"",
        "comment.yaml": b"# only a comment\n",
        "list.yaml": b"- weights\n- mxfp4\n",
        "scalar.yaml": b"mxfp4\n",
        "int_weights.yaml": b"weights: 5\n",
        "unknown_key.yaml": b"weights: mxfp4\nweight: mxfp4\n",
        "bad_yaml.yaml": b"weights: [mxfp4\n",
        "bad.json": b'{"weights": "mxfp4",}',
        "null.yaml": b"weights: null\nactivations: null\n",
        "exclude_str.yaml": b"weights: mxfp4\nexclude: fc1\n",
        "no_node.yaml": b"weights: mxfp4\nnode_overrides:\n  nosuch: {weights: mx6}\n",
        "bad_mode.yaml": b"weights: mxfp4\nround_mode: sideways\n",
        "mode_list.yaml": b"weights: mxfp4\nscale_mode: [floor]\n",
        "bad_axis.yaml": b"weights: mxfp4\nop_type_overrides:\n  MatMul: {weight_axis: x}\n",
        "axis_range.yaml": b"weights: mxfp4\nop_type_overrides:\n  MatMul: {weight_axis: 7}\n",
        "bad_op.yaml": b"weights: mxfp4\nop_types: [Softmax]\n",
        "override_list.yaml": b"weights: mxfp4\nop_type_overrides: [MatMul]\n",
        "no_fallback.yaml": b"weights: mxfp4\nactivations: mxfp8e4\nscale_mode: midmax\n",
        "custom.yaml": b"weights: mxfp4\nactivations: uint4_block32\ncustom_ops_only: true\n",
        "custom_bad.yaml": b"weights: mxfp4\ncustom_ops_only: maybe\n",
        # YAML aliases: exclude holds lists of lists (nesting them deeper grows str() of them
        # exponentially), not node names
        "laughs.yaml": b"weights: mxfp4\nop_types: [MatMul]\nexclude: &e9 ["
        + b",".join([b"&e8 [" + b",".join([b'"x"'] * 10) + b"]"] + [b"*e8"] * 9)
        + b"]\n",
        "huge.yaml": b"weights: mxfp4\n" + b"# padding\n" * 120_000,
    }
    for name, text in recipes.items():
        (d / name).write_bytes(text)
    return d


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# -- the cases ---------------------------------------------------------------------------------
# {in}: the inputs folder; {out}: an empty folder for this case's outputs. Expected status 0
# or 2; for 2, an optional word the one-line message must contain.
Q = ["quantize", "{in}/tiny.onnx", "-o", "{out}/q.onnx"]
CASES: list[tuple[str, list[str], int, str]] = [
    # the command line itself
    ("no command", [], 2, "COMMAND"),
    ("unknown command", ["bogus"], 2, "bogus"),
    ("unknown option", ["--bogus"], 2, "onnxq --help"),
    ("version", ["--version"], 0, ""),
    ("formats", ["formats"], 0, ""),
    ("formats extra", ["formats", "extra"], 2, "extra"),
    # quantize: bad models
    ("q missing", ["quantize", "{in}/nope.onnx", "-o", "{out}/q.onnx", "--weights", "mxfp4"], 2,
     "does not exist"),
    ("q directory", ["quantize", "{in}/a_dir", "-o", "{out}/q.onnx", "--weights", "mxfp4"], 2,
     "directory"),
    ("q empty", ["quantize", "{in}/empty.onnx", "-o", "{out}/q.onnx", "--weights", "mxfp4"], 2,
     "empty.onnx"),
    ("q truncated", ["quantize", "{in}/truncated.onnx", "-o", "{out}/q.onnx", "--weights",
                     "mxfp4"], 2, "truncated"),
    ("q garbage", ["quantize", "{in}/garbage.onnx", "-o", "{out}/q.onnx", "--weights", "mxfp4"],
     2, "garbage.onnx"),
    ("q dangling", ["quantize", "{in}/dangling.onnx", "-o", "{out}/q.onnx", "--weights",
                    "mxfp4"], 2, ""),
    ("q nothing targeted", ["quantize", "{in}/relu.onnx", "-o", "{out}/q.onnx", "--weights",
                            "mxfp4"], 2, "nothing"),
    ("q short payload", ["quantize", "{in}/short.onnx", "-o", "{out}/q.onnx", "--weights",
                         "mxfp4"], 2, "w1"),
    ("q impossible shapes", ["quantize", "{in}/mismatch.onnx", "-o", "{out}/q.onnx",
                             "--weights", "mxfp4"], 2, "not valid ONNX"),
    ("q nothing targeted, allowed", ["quantize", "{in}/relu.onnx", "-o", "{out}/q.onnx",
                                     "--weights", "mxfp4", "--allow-empty"], 0, ""),
    ("q quantized twice", ["quantize", "{in}/q.onnx", "-o", "{out}/q.onnx", "--weights",
                           "mxfp4"], 2, ""),
    # quantize: bad options
    ("q no output", ["quantize", "{in}/tiny.onnx", "--weights", "mxfp4"], 2, "--output"),
    ("q no model", ["quantize"], 2, "MODEL"),
    ("q no format", Q, 2, "nothing to quantize"),
    ("q bad format", [*Q, "--weights", "mxfp3"], 2, "mxfp3"),
    ("q bad activation format", [*Q, "--activations", "bogus"], 2, "bogus"),
    # grid steps below float64's normal range (docs/formats.md, "Limits")
    ("q scale steps too fine", [*Q, "--weights", "e2m1_e5m0b1074_t4"], 2,
     "use a bias of at most 1022"),
    ("q element steps too fine", [*Q, "--weights", "e3m28b996_e10m0_t32"], 2,
     "use a bias of at most 995"),
    ("q bad storage", [*Q, "--weights", "mxfp4", "--storage", "zip"], 2, "zip"),
    ("q bad target", [*Q, "--weights", "mxfp4", "--target", "gpu"], 2, "gpu"),
    ("q percentile zero", [*Q, "--weights", "mxfp4", "--percentile", "0"], 2, "percentile"),
    ("q percentile nan", [*Q, "--weights", "mxfp4", "--percentile", "nan"], 2, "percentile"),
    ("q calibration missing", [*Q, "--activations", "int8_tensor", "--calibration",
                               "{in}/nope"], 2, "--calibration"),
    ("q calibration empty", ["quantize", "{in}/static.onnx", "-o", "{out}/q.onnx",
                             "--activations", "int8_tensor", "--calibration", "{in}/calib"],
     2, ".npz"),
    ("q calibration bad npz", ["quantize", "{in}/static.onnx", "-o", "{out}/q.onnx",
                               "--activations", "int8_tensor", "--calibration",
                               "{in}/calib_bad"], 2, ""),
    ("q bad preset", [*Q, "--preset", "mx7-deploy"], 2, "mx7-deploy"),
    ("q preset and weights", [*Q, "--preset", "mx6-deploy", "--weights", "mxfp4"], 2,
     "--preset"),
    ("q block size no preset", [*Q, "--weights", "mxfp4", "--block-size", "8"], 2,
     "--block-size"),
    ("q bad block size", [*Q, "--preset", "bfp16-deploy", "--block-size", "3"], 2, "3"),
    # quantize: outputs
    ("q output missing folder", ["quantize", "{in}/tiny.onnx", "-o", "{out}/no/q.onnx",
                                 "--weights", "mxfp4"], 2, "folder"),
    ("q output is a folder", ["quantize", "{in}/tiny.onnx", "-o", "{in}/a_dir", "--weights",
                              "mxfp4"], 2, "directory"),
    ("q output under a file", ["quantize", "{in}/tiny.onnx", "-o", "{in}/a_file/q.onnx",
                               "--weights", "mxfp4"], 2, "folder"),
    ("q output is the input", ["quantize", "{in}/tiny.onnx", "-o", "{in}/tiny.onnx",
                               "--weights", "mxfp4"], 2, "--overwrite"),
    ("q output is the input, relative", ["quantize", "{in}/tiny.onnx", "-o",
                                         "{in}/a_dir/../tiny.onnx", "--weights", "mxfp4"], 2,
     "--overwrite"),
    ("q output is the input's data", ["quantize", "{in}/ext.onnx", "-o", "{in}/ext.onnx.data",
                                      "--weights", "mxfp4"], 2, "external data"),
    ("q output is the recipe", [*Q, "--weights", "mxfp4", "--recipe", "{in}/null.yaml", "-o",
                                "{in}/null.yaml"], 2, "--recipe file"),
    ("q external data success", ["quantize", "{in}/ext.onnx", "-o", "{out}/q.onnx",
                                 "--weights", "mxfp4"], 0, ""),
    # quantize: recipes
    ("r missing", [*Q, "--recipe", "{in}/nope.yaml"], 2, "nope.yaml"),
    ("r directory", [*Q, "--recipe", "{in}/a_dir"], 2, "a_dir"),
    ("r binary", [*Q, "--recipe", "{in}/binary.yaml"], 2, "binary.yaml"),
    ("r empty", [*Q, "--recipe", "{in}/empty.yaml"], 2, "empty.yaml"),
    ("r comment only", [*Q, "--recipe", "{in}/comment.yaml"], 2, "comment.yaml"),
    ("r list", [*Q, "--recipe", "{in}/list.yaml"], 2, "list.yaml"),
    ("r int format", [*Q, "--recipe", "{in}/int_weights.yaml"], 2, "weights"),
    ("r unknown key", [*Q, "--recipe", "{in}/unknown_key.yaml"], 2, "weight"),
    ("r bad yaml", [*Q, "--recipe", "{in}/bad_yaml.yaml"], 2, "bad_yaml.yaml"),
    ("r bad json", [*Q, "--recipe", "{in}/bad.json"], 2, "bad.json"),
    ("r quantizes nothing", [*Q, "--recipe", "{in}/null.yaml"], 2, "null.yaml"),
    ("r exclude string", [*Q, "--recipe", "{in}/exclude_str.yaml"], 2, "exclude"),
    ("r unknown node", [*Q, "--recipe", "{in}/no_node.yaml"], 2, "nosuch"),
    ("r bad mode", [*Q, "--recipe", "{in}/bad_mode.yaml"], 2, "sideways"),
    ("r mode list", [*Q, "--recipe", "{in}/mode_list.yaml"], 2, "scale_mode"),
    ("r axis text", [*Q, "--recipe", "{in}/bad_axis.yaml"], 2, "weight_axis"),
    ("r axis out of range", [*Q, "--recipe", "{in}/axis_range.yaml"], 2, "axis"),
    ("r unsupported op", [*Q, "--recipe", "{in}/bad_op.yaml"], 2, "Softmax"),
    ("r override list", [*Q, "--recipe", "{in}/override_list.yaml"], 2, "op_type_overrides"),
    ("r nested aliases", [*Q, "--recipe", "{in}/laughs.yaml"], 2, "exclude"),
    ("r too big", [*Q, "--recipe", "{in}/huge.yaml"], 2, "huge.yaml"),
    ("r custom flag not bool", [*Q, "--recipe", "{in}/custom_bad.yaml"], 2, "custom_ops_only"),
    # quantize: promises a plain onnxruntime could not keep
    ("q no fallback: uint4_block32 activations", ["quantize", "{in}/static.onnx", "-o",
                                          "{out}/q.onnx", "--activations", "uint4_block32"], 2,
     "--custom-ops-only"),
    ("q no fallback: midmax", ["quantize", "{in}/static.onnx", "-o", "{out}/q.onnx",
                               "--recipe", "{in}/no_fallback.yaml"], 2, "midmax"),
    ("q custom-op-only flag", ["quantize", "{in}/static.onnx", "-o", "{out}/q.onnx",
                               "--activations", "uint4_block32", "--custom-ops-only"], 0, ""),
    ("q custom-op-only recipe", ["quantize", "{in}/static.onnx", "-o", "{out}/q.onnx",
                                 "--recipe", "{in}/custom.yaml"], 0, ""),
    ("q custom-op-only standard", [*Q, "--weights", "mxfp4", "--target", "standard",
                                   "--custom-ops-only"], 2, "--custom-ops-only"),
    ("q standard uint4_block32 activations", ["quantize", "{in}/static.onnx", "-o",
                                              "{out}/q.onnx", "--activations", "uint4_block32",
                                              "--target", "standard"], 2, "uint4_block32"),
    ("q success", [*Q, "--weights", "mxfp4"], 0, ""),
    # run
    ("run missing", ["run", "{in}/nope.onnx"], 2, "does not exist"),
    ("run directory", ["run", "{in}/a_dir"], 2, "directory"),
    ("run empty", ["run", "{in}/empty.onnx"], 2, "empty.onnx"),
    ("run garbage", ["run", "{in}/garbage.onnx"], 2, "garbage.onnx"),
    ("run foreign op", ["run", "{in}/foreign.onnx"], 2, "onnxruntime"),
    ("run dangling", ["run", "{in}/dangling.onnx"], 2, "onnxruntime"),
    ("run inputs missing", ["run", "{in}/tiny.onnx", "--inputs", "{in}/nope.npz"], 2,
     "--inputs"),
    ("run inputs garbage", ["run", "{in}/tiny.onnx", "--inputs", "{in}/garbage.npz"], 2,
     "--inputs"),
    ("run inputs a pickle", ["run", "{in}/tiny.onnx", "--inputs", "{in}/pickle.npz"], 2,
     "--inputs"),
    ("run inputs with objects", ["run", "{in}/tiny.onnx", "--inputs", "{in}/pickled.npz"], 2,
     "--inputs"),
    ("run inputs a model", ["run", "{in}/tiny.onnx", "--inputs", "{in}/tiny.onnx"], 2,
     "--inputs"),
    ("run inputs wrong name", ["run", "{in}/tiny.onnx", "--inputs", "{in}/names.npz"], 2,
     "--inputs"),
    ("run inputs strings", ["run", "{in}/tiny.onnx", "--inputs", "{in}/strings.npz"], 2, "x"),
    ("run inputs wrong shape", ["run", "{in}/tiny.onnx", "--inputs", "{in}/shape.npz"], 2,
     "shape"),
    ("run inputs int to float", ["run", "{in}/tiny.onnx", "--inputs", "{in}/int.npz"], 0, ""),
    ("run batch zero", ["run", "{in}/tiny.onnx", "--batch", "0"], 2, "--batch"),
    ("run batch negative", ["run", "{in}/tiny.onnx", "--batch", "-3"], 2, "--batch"),
    ("run batch huge", ["run", "{in}/tiny.onnx", "--batch", "1000000000000"], 2, "--batch"),
    ("run bad dim", ["run", "{in}/tiny.onnx", "--dim", "N"], 2, "--dim"),
    ("run dim zero", ["run", "{in}/tiny.onnx", "--dim", "N=0"], 2, "--dim"),
    ("run seed negative", ["run", "{in}/tiny.onnx", "--seed", "-1"], 2, "--seed"),
    ("run save missing folder", ["run", "{in}/tiny.onnx", "--save", "{out}/no/o.npz"], 2,
     "--save"),
    ("run save a folder", ["run", "{in}/tiny.onnx", "--save", "{in}/a_dir"], 2, "--save"),
    ("run save over the model", ["run", "{in}/tiny.onnx", "--save", "{in}/tiny.onnx"], 2,
     "--save"),
    ("run save over the model's data", ["run", "{in}/ext.onnx", "--save",
                                        "{in}/ext.onnx.data"], 2, "external data"),
    ("run save over the inputs", ["run", "{in}/tiny.onnx", "--inputs", "{in}/good.npz",
                                  "--save", "{in}/good.npz"], 2, "--inputs file"),
    ("run bad onnxq dtype", ["run", "{in}/dq_fmt.onnx"], 2, ""),
    ("run huge shape attribute", ["run", "{in}/dq_huge.onnx"], 2, ""),
    ("run success", ["run", "{in}/q.onnx", "--save", "{out}/o.npz"], 0, ""),
    # compare
    ("cmp missing", ["compare", "{in}/tiny.onnx", "{in}/nope.onnx"], 2, "does not exist"),
    ("cmp garbage", ["compare", "{in}/garbage.onnx", "{in}/q.onnx"], 2, "garbage.onnx"),
    ("cmp one model", ["compare", "{in}/tiny.onnx"], 2, "QUANT"),
    ("cmp other inputs", ["compare", "{in}/tiny.onnx", "{in}/relu.onnx"], 2, "inputs"),
    ("cmp inputs wrong name", ["compare", "{in}/tiny.onnx", "{in}/q.onnx", "--inputs",
                               "{in}/names.npz"], 2, "--inputs"),
    ("cmp success", ["compare", "{in}/tiny.onnx", "{in}/q.onnx", "--layers"], 0, ""),
    # inspect
    ("inspect missing", ["inspect", "{in}/nope.onnx"], 2, "does not exist"),
    ("inspect empty", ["inspect", "{in}/empty.onnx"], 2, "empty.onnx"),
    ("inspect truncated", ["inspect", "{in}/truncated.onnx"], 2, "truncated"),
    ("inspect two models", ["inspect", "{in}/tiny.onnx", "{in}/q.onnx"], 2, "q.onnx"),
    ("inspect bad output_type", ["inspect", "{in}/dq_type.onnx"], 0, ""),
    ("inspect bad dtype", ["inspect", "{in}/dq_fmt.onnx"], 2, "bad dtype"),
    ("inspect no dtype", ["inspect", "{in}/dq_nodtype.onnx"], 2, "no dtype attribute"),
    ("inspect huge shape", ["inspect", "{in}/dq_huge.onnx"], 0, ""),
    ("inspect unknown element type", ["inspect", "{in}/type999.onnx"], 0, ""),
    ("inspect float", ["inspect", "{in}/tiny.onnx"], 0, ""),
    ("inspect quantized", ["inspect", "{in}/q.onnx"], 0, ""),
    # export
    ("export no output", ["export", "{in}/q.onnx"], 2, "--output"),
    ("export missing", ["export", "{in}/nope.onnx", "-o", "{out}/hw"], 2, "does not exist"),
    ("export garbage", ["export", "{in}/garbage.onnx", "-o", "{out}/hw"], 2, "garbage.onnx"),
    ("export float model", ["export", "{in}/tiny.onnx", "-o", "{out}/hw"], 2, "onnxq quantize"),
    ("export fake storage", ["export", "{in}/fake.onnx", "-o", "{out}/hw"], 2, "fake"),
    ("export standard target", ["export", "{in}/std.onnx", "-o", "{out}/hw"], 2, "standard"),
    ("export codebook", ["export", "{in}/cb.onnx", "-o", "{out}/hw"], 2, "codebook"),
    ("export no dtype", ["export", "{in}/dq_nodtype.onnx", "-o", "{out}/hw"], 2, "malformed"),
    ("export bad dtype", ["export", "{in}/dq_fmt.onnx", "-o", "{out}/hw"], 2, "malformed"),
    ("export output is a file", ["export", "{in}/q.onnx", "-o", "{in}/a_file"], 2, "a_file"),
    ("export output parent missing", ["export", "{in}/q.onnx", "-o", "{out}/no/hw"], 2,
     "does not exist"),
    ("export output not empty", ["export", "{in}/q.onnx", "-o", "{in}/full_dir"], 2,
     "--overwrite"),
    ("export success", ["export", "{in}/q.onnx", "-o", "{out}/hw"], 0, ""),
    ("tune no budget", ["tune", "{in}/tiny.onnx", "-o", "{out}/q.onnx", "--inputs",
     "{in}/good.npz"], 2, "--budget"),
    ("tune missing model", ["tune", "{in}/nope.onnx", "-o", "{out}/q.onnx", "--inputs",
     "{in}/good.npz", "--budget", "cosine>=0.9"], 2, "does not exist"),
    ("tune unknown metric", ["tune", "{in}/tiny.onnx", "-o", "{out}/q.onnx", "--inputs",
     "{in}/good.npz", "--budget", "psnr>=30"], 2, "psnr"),
    ("tune no samples", ["tune", "{in}/tiny.onnx", "-o", "{out}/q.onnx", "--inputs",
     "{in}/calib", "--budget", "cosine>=0.9"], 2, "no sample"),
    ("tune input names", ["tune", "{in}/tiny.onnx", "-o", "{out}/q.onnx", "--inputs",
     "{in}/names.npz", "--budget", "cosine>=0.9"], 2, "model takes"),
    ("tune input shapes", ["tune", "{in}/tiny.onnx", "-o", "{out}/q.onnx", "--inputs",
     "{in}/good.npz", "--budget", "cosine>=0.9"], 2, "does not fit"),
]  # fmt: skip


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    env.pop("ONNXQ_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "onnxq", *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=cwd,
        env=env,
    )


@pytest.mark.parametrize(
    ("argv", "status", "word"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_exits_2_in_one_line_and_writes_nothing(
    argv: list[str], status: int, word: str, ins: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    before = _hashes(ins)
    args = [a.replace("{in}", str(ins)).replace("{out}", str(out)) for a in argv]
    done = _run(args, tmp_path)
    assert _hashes(ins) == before, "an input file changed"
    assert done.returncode == status, (done.returncode, done.stderr)
    if status == 2:
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("onnxq: error: "), done.stderr
        assert word in lines[0], lines[0]
        assert sorted(p.name for p in out.iterdir()) == [], "output left behind"
    else:
        assert "Traceback" not in done.stderr, done.stderr
        if any("{out}" in a for a in argv):  # the output was written
            assert any(out.iterdir())
    leftovers = [p.name for p in (*ins.iterdir(), *out.iterdir()) if p.name.startswith(".")]
    assert leftovers == []


def test_every_subcommand_is_swept() -> None:
    from onnxq import cli

    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    swept = {argv[0] for _, argv, _, _ in CASES if argv and not argv[0].startswith("-")}
    assert set(commands) <= swept
    assert sum(status == 2 for *_, status, _ in CASES) >= 60


# -- a reader that goes away ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["formats"],
        ["--version"],
        ["quantize", "--help"],
        ["quantize", "--list-presets"],
        ["inspect", "{in}/q.onnx"],
        ["run", "{in}/q.onnx"],
        ["compare", "{in}/tiny.onnx", "{in}/q.onnx"],
        ["export", "{in}/q.onnx", "-o", "{out}/hw"],
        ["quantize", "{in}/tiny.onnx", "-o", "{out}/q.onnx", "--weights", "mxfp4"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_closed_stdout_stops_quietly_with_status_141(
    argv: list[str], ins: Path, tmp_path: Path
) -> None:
    """``onnxq inspect m.onnx | head``: no BrokenPipeError traceback, the SIGPIPE status."""
    args = [a.replace("{in}", str(ins)).replace("{out}", str(tmp_path)) for a in argv]
    read, write = os.pipe()
    os.close(read)  # nobody will read: the first write fails with EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "onnxq", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=TIMEOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    finally:
        os.close(write)
    assert done.stderr == ""
    assert done.returncode == 141
