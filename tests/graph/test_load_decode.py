"""Constant weights decoded when the session is created (onnxq.graph.load_decode).

``runtime.session(model)`` (``decode_weights="load"``) runs each constant DequantizeMX /
CodebookLookup once in the op's kernel and hands onnxruntime float initializers;
``decode_weights="run"`` keeps the op in the graph. What must hold:

- the decoded values are the op's bits: with onnxruntime's weight pre-packing and graph
  optimizations off (the only places where onnxruntime computes differently with a constant
  weight), both sessions give the same output bits, for every weight format family, on small
  built graphs and on real models;
- with onnxruntime's defaults, the session equals a plain onnxruntime session of the float
  model whose weights are the numpy reference's decode (``onnxq.upcast``), bit for bit;
- what must stay stays: a decoder whose output is a graph output, decoders inside subgraphs,
  packed initializers that another node (a fused op) reads; nothing else of the packed model
  reaches onnxruntime, and no temporary file outlives the session;
- input files are not modified; hostile inputs give the op's one-line ``[DequantizeMX]`` error.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxq
from onnxq.deploy.export import quantized_weights
from onnxq.graph import load_decode
from onnxq.graph.quantize import quantize_model
from tests.graph.handed import handed_model
from tests.models import builders
from tests.models.real import MissingModelError, example_inputs, model_path

pytestmark = pytest.mark.needs_custom_ops
ort = pytest.importorskip("onnxruntime")
runtime = pytest.importorskip("onnxq.runtime")

# One data type per family: MX fp and int, BFP, MX9/MX6 (shift bits), NVFP4 (float scales and a
# tensor scale), int with a zero point, a codebook, N:M sparse (Mask).
FORMATS = [
    "mxfp4",
    "mxfp8e4",
    "mxint8",
    "bfp16",
    "mx6",
    "mx9",
    "nvfp4",
    "uint4_block32",
    "cb41fi_e2m2fnuz_e8m0_t32",
    "e2m1fnuz_e8m0_t32n2m4",
]


def _exact_options() -> ort.SessionOptions:
    """Options under which a constant weight computes as a computed one does."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.add_session_config_entry("session.disable_prepacking", "1")
    options.intra_op_num_threads = 1
    return options


def _bits(outputs: list[np.ndarray]) -> list[bytes]:
    return [np.ascontiguousarray(y).tobytes() for y in outputs]


def _both(model: onnx.ModelProto | str | Path, feeds: dict[str, np.ndarray]) -> list[bytes]:
    """Outputs of the load and run sessions (exact options); asserts they are the same bits."""
    load = runtime.session(model, sess_options=_exact_options())
    run = runtime.session(model, sess_options=_exact_options(), decode_weights="run")
    names = {i.name for i in run.get_inputs()}
    feed = {k: v for k, v in feeds.items() if k in names}
    got = _bits(load.run(None, feed))
    assert got == _bits(run.run(None, feed))
    return got


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("dt", FORMATS)
def test_mlp_same_bits_as_the_op(dt: str) -> None:
    model, feeds = builders.mlp()
    packed = quantize_model(model, weights=dt, fuse=False)
    folds = load_decode.foldable(packed)
    assert len(folds) == 3  # two MatMul weights and the Gemm head
    _both(packed, feeds)


@pytest.mark.parametrize("dt", ["mxfp4", "bfp16", "mx6", "nvfp4", "uint4_block32"])
def test_defaults_equal_the_reference_float_model(dt: str) -> None:
    """Default options: the float model with numpy-reference weights, bit for bit."""
    model, feeds = builders.mlp()
    packed = quantize_model(model, weights=dt, fuse=False)
    baked = onnx.ModelProto()
    baked.CopyFrom(packed)
    weights = quantized_weights(packed)
    keep = [n for n in baked.graph.node if n.op_type != "DequantizeMX"]
    del baked.graph.node[:]
    baked.graph.node.extend(keep)
    for name, q in weights.items():
        value = onnxq.upcast(q)  # the numpy reference (onnxq.cast.reference.dequantize)
        baked.graph.initializer.append(numpy_helper.from_array(value, name))
    plain = ort.InferenceSession(baked.SerializeToString(), providers=["CPUExecutionProvider"])
    want = _bits(plain.run(None, feeds))
    assert _bits(runtime.session(packed).run(None, feeds)) == want


def test_tiled_conv_weights_fold_with_their_reshape() -> None:
    model, feeds = builders.cnn()
    packed = quantize_model(model, weights="mxfp4", fuse=False)
    folds = load_decode.foldable(packed)
    reshaped = [f for f in folds if f.reshape is not None]
    assert reshaped, "the 3-channel conv is tiled as a matrix + Reshape (graph/tiling.py)"
    for f in reshaped:
        assert len(f.dims) == 4 and len(f.y_dims) == 2  # the conv layout, from the matrix
        assert np.prod(f.dims) == np.prod(f.y_dims)
    _both(packed, feeds)
    handed = handed_model(packed)
    assert "Reshape" not in _ops(handed) and "DequantizeMX" not in _ops(handed)


@pytest.mark.parametrize("builder", ["transformer", "lstm", "gru", "embedding", "if_constant"])
def test_built_models_same_bits(builder: str) -> None:
    model, feeds = builders.BUILDERS[builder]()
    packed = quantize_model(model, weights="mxfp4", fuse=False)
    _both(packed, feeds)


def test_subgraph_decoders_stay_and_outer_weights_fold() -> None:
    model, feeds = builders.if_constant()
    packed = quantize_model(model, weights="mxfp4", fuse=False)
    # The pass hoists branch weights' decoders to the main graph; move then_w's (with its
    # packed inputs) back into the then branch: a decoder inside a subgraph.
    main = packed.graph
    node = next(n for n in main.node if n.output[0] == "then_w")
    inits = [t for t in main.initializer if t.name.startswith("then_w__")]
    branch = next(
        a.g for n in main.node if n.op_type == "If" for a in n.attribute if a.name == "then_branch"
    )
    branch.node.insert(0, node)
    branch.initializer.extend(inits)
    # infer_shapes does not type onnxq outputs inside subgraphs: declare it (as a model must)
    branch.value_info.append(helper.make_tensor_value_info("then_w", TensorProto.FLOAT, [32, 32]))
    keep = [n for n in main.node if n.output[0] != "then_w"]
    del main.node[:]
    main.node.extend(keep)
    keep_t = [t for t in main.initializer if not t.name.startswith("then_w__")]
    del main.initializer[:]
    main.initializer.extend(keep_t)
    assert {f.name for f in load_decode.foldable(packed)} == {
        "const_w",
        "shared_w",
        "wt",
        "else_w",
        "outer_w",
    }  # outer_w and else_w are read inside the branches: main-graph initializers
    handed = handed_model(packed, load_external_data=True)
    assert "DequantizeMX" not in _ops(handed)
    branches = [a.g for n in handed.graph.node if n.op_type == "If" for a in n.attribute]
    assert "DequantizeMX" in [m.op_type for g in branches for m in g.node]
    for cond in (True, False):
        _both(packed, {**feeds, "cond": np.array(cond)})


def _decoder_graph(
    dt: str = "mxfp4", out_type: int = TensorProto.FLOAT, *, shape_input: bool = False
) -> tuple[onnx.ModelProto, dict[str, np.ndarray], np.ndarray]:
    """Y = DequantizeMX(W); two MatMuls read Y (a shared decoded weight); GatherMX reads W's
    packed inputs too. Returns the model, its feeds and W as the numpy reference decodes it."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    q = onnxq.cast(w, dt, axis=0, mode="compress", backend="reference")
    inits = [numpy_helper.from_array(q.data, "w_q"), numpy_helper.from_array(q.scale, "w_s")]
    names = ["w_q", "w_s"]
    attrs = {"dtype": dt, "axis": 0, "output_type": out_type}
    if shape_input:
        inits.append(numpy_helper.from_array(np.array(w.shape, np.int64), "w_shape"))
        names += ["", "", "", "", "w_shape"]
    else:
        attrs["shape"] = list(w.shape)
    n = helper.make_node
    nodes = [n("DequantizeMX", names, ["w_y"], domain="onnxq", **attrs)]
    wf = "w_y"
    if out_type != TensorProto.FLOAT:
        nodes.append(n("Cast", ["w_y"], ["w_f"], to=TensorProto.FLOAT))
        wf = "w_f"
    nodes += [
        n("MatMul", ["x", wf], ["a"]),
        n("MatMul", ["x2", wf], ["b"]),
        n("Add", ["a", "b"], ["y"]),
        n(
            "GatherMX",
            ["idx", "w_q", "w_s"],
            ["rows"],
            domain="onnxq",
            dtype=dt,
            axis=0,
            shape=list(w.shape),
        ),
    ]
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "shared",
        [
            helper.make_tensor_value_info("x", f, [3, 64]),
            helper.make_tensor_value_info("x2", f, [3, 64]),
            helper.make_tensor_value_info("idx", TensorProto.INT64, [2]),
        ],
        [
            helper.make_tensor_value_info("y", f, [3, 32]),
            helper.make_tensor_value_info("rows", f, [2, 32]),
        ],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    feeds = {
        "x": rng.standard_normal((3, 64)).astype(np.float32),
        "x2": rng.standard_normal((3, 64)).astype(np.float32),
        "idx": np.array([5, 63], np.int64),
    }
    return model, feeds, onnxq.upcast(q)


@pytest.mark.parametrize("out_type", [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16])
def test_shared_weight_and_fused_reader(out_type: int) -> None:
    model, feeds, _ = _decoder_graph(out_type=out_type)
    _both(model, feeds)
    handed = handed_model(model)
    stored = {t.name: t for t in handed.graph.initializer}
    assert stored["w_y"].data_type == out_type  # the node's output_type, one initializer
    assert stored["w_y"].data_location == TensorProto.EXTERNAL
    assert {"w_q", "w_s"} <= stored.keys()  # GatherMX still reads the packed table
    assert (
        _ops(handed)
        == ["Cast", "MatMul", "MatMul", "Add", "GatherMX"][int(out_type == TensorProto.FLOAT) :]
    )


def test_packed_inputs_only_the_decoder_read_are_dropped() -> None:
    model, _, ref = _decoder_graph()
    del model.graph.node[-1]  # no GatherMX
    del model.graph.output[-1]
    given = load_decode.session_model(model, runtime.library_path(), Path.cwd())
    try:
        handed = onnx.load(str(given.model), load_external_data=False)
        data = Path(given.model).parent / "onnxq-decoded-weights.bin"
        raw = np.fromfile(data, np.float32)[: ref.size].reshape(ref.shape)
    finally:
        given.close()
    assert not Path(given.model).parent.exists()  # close removes the temporary folder
    assert [t.name for t in handed.graph.initializer] == ["w_y"]
    # The decoded file holds the numpy reference's bits (an independent decode).
    assert raw.tobytes() == ref.tobytes()


def test_shape_input_decoder_folds() -> None:
    model, feeds, _ = _decoder_graph(shape_input=True)
    assert [f.dims for f in load_decode.foldable(model)] == [(64, 32)]
    _both(model, feeds)


def test_graph_output_decoder_stays() -> None:
    model, feeds, ref = _decoder_graph()
    model.graph.output.append(helper.make_tensor_value_info("w_y", TensorProto.FLOAT, [64, 32]))
    assert load_decode.foldable(model) == []
    out = runtime.session(model).run(["w_y"], feeds)[0]
    assert out.tobytes() == ref.tobytes()
    _both(model, feeds)


def test_graph_input_initializer_stays() -> None:
    """An initializer that is also a graph input can be overridden: its decoder stays."""
    model, _, _ = _decoder_graph()
    model.graph.input.append(helper.make_tensor_value_info("w_s", TensorProto.UINT8, [2, 32]))
    assert load_decode.foldable(model) == []


def test_memory_fallback_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """No writable temporary folder: the decoded weights go through memory, same bits."""
    model, feeds, _ = _decoder_graph()
    want = _both(model, feeds)

    def refuse(*args: object, **kwargs: object) -> str:
        raise OSError("read-only file system")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    options = _exact_options()
    got = runtime.session(model, sess_options=options).run(None, feeds)
    assert _bits(got) == want
    # The same options again (a second session): the first buffer's name is never reused.
    again = runtime.session(model, sess_options=_exact_options()).run(None, feeds)
    assert _bits(again) == want


def test_no_temporary_files_remain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model, feeds, _ = _decoder_graph()
    sess = runtime.session(model)
    assert list(tmp_path.iterdir()) == []
    sess.run(None, feeds)  # onnxruntime holds what it needs: the removed file is not read


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def test_external_data_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    model, feeds = builders.mlp(width=128)
    packed = quantize_model(model, weights="mxfp4", fuse=False)
    path = tmp_path / "m.onnx"
    onnx.save_model(
        packed, str(path), save_as_external_data=True, location="m.data", size_threshold=0
    )
    before = _digest(tmp_path)
    want = _both(path, feeds)
    # A ModelProto whose external data lies in the working directory.
    monkeypatch.chdir(tmp_path)
    proto = onnx.load(str(path), load_external_data=False)
    assert any(t.data_location == TensorProto.EXTERNAL for t in proto.graph.initializer)
    copy = proto.SerializeToString()
    assert _bits(runtime.session(proto, sess_options=_exact_options()).run(None, feeds)) == want
    assert proto.SerializeToString() == copy  # the ModelProto is not modified
    assert _digest(tmp_path) == before  # nor are the files


def test_model_not_modified() -> None:
    model, feeds, _ = _decoder_graph()
    copy = model.SerializeToString()
    runtime.session(model).run(None, feeds)
    assert model.SerializeToString() == copy


def test_bad_scale_gives_the_ops_error() -> None:
    model, feeds, _ = _decoder_graph()
    for t in model.graph.initializer:
        if t.name == "w_s":
            t.CopyFrom(numpy_helper.from_array(np.zeros((3, 32), np.uint8), "w_s"))
    with pytest.raises(ValueError, match=r"^\[DequantizeMX\] input Scale ") as err:
        runtime.session(model)
    assert "\n" not in str(err.value)
    # The run-time decode reports the same check when the session runs.
    with pytest.raises(Exception, match=r"\[DequantizeMX\] input Scale "):
        runtime.session(model, decode_weights="run").run(None, feeds)


@pytest.mark.parametrize("length", [1000, 7])
def test_short_codes_give_the_ops_error(length: int) -> None:
    """1000 of 1024 bytes: refused at creation. 7 bytes cannot hold 2048 codes of even one
    bit: left to the op (as a hostile shape is), which refuses it at the first run."""
    model, feeds, _ = _decoder_graph()
    for t in model.graph.initializer:
        if t.name == "w_q":
            t.CopyFrom(numpy_helper.from_array(np.zeros(length, np.uint8), "w_q"))
    del model.graph.node[-1]  # GatherMX reads w_q too
    del model.graph.output[-1]
    if length == 1000:
        with pytest.raises(ValueError, match=r"^\[DequantizeMX\] input Q "):
            runtime.session(model)
    else:
        sess = runtime.session(model)
        with pytest.raises(Exception, match=r"\[DequantizeMX\] input Q "):
            sess.run(None, feeds)


def test_hostile_shape_is_left_to_the_op() -> None:
    """A shape far larger than the packed inputs: never allocated here; the op refuses it."""
    model, feeds, _ = _decoder_graph()
    del model.graph.node[-1]
    del model.graph.output[-1]
    node = model.graph.node[0]
    for a in node.attribute:
        if a.name == "shape":
            del a.ints[:]
            a.ints.extend([64, 1 << 24])  # 2^30 values from 1 KiB of codes
    model.graph.output[0].type.tensor_type.ClearField("shape")
    assert load_decode.foldable(model) == []
    with pytest.raises(Exception, match=r"\[DequantizeMX\]"):
        runtime.session(model).run(None, feeds)


def test_unknown_mode_refused() -> None:
    model, _, _ = _decoder_graph()
    with pytest.raises(ValueError, match="decode_weights='later' is not one of load, run"):
        runtime.session(model, decode_weights="later")


@pytest.mark.parametrize("name", ["minilm", "ppocr", "silero"])
def test_real_models_same_bits(name: str, tmp_path: Path) -> None:
    try:
        src = model_path(name)
    except MissingModelError as err:
        pytest.skip(str(err))
    out = tmp_path / "packed.onnx"
    quantize_model(str(src), str(out), weights="mxfp4", fuse=False)
    packed = onnx.load(str(out))
    assert load_decode.foldable(packed)
    before = _digest(tmp_path)
    _both(out, example_inputs(name, batch=1))
    assert _digest(tmp_path) == before


def test_chunks_bound_the_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding chunk by chunk (a tiny chunk size) writes the same file."""
    model, feeds = builders.mlp()
    packed = quantize_model(model, weights="mx6", fuse=False)
    want = _both(packed, feeds)
    monkeypatch.setattr(load_decode, "CHUNK_BYTES", 1)
    assert len(list(load_decode._chunks(load_decode.foldable(packed)))) == 3
    assert _bits(runtime.session(packed, sess_options=_exact_options()).run(None, feeds)) == want


@pytest.mark.skipif(os.name != "posix", reason="the temporary-file route is POSIX only")
def test_file_and_memory_routes_agree() -> None:
    model, _ = builders.transformer()
    packed = quantize_model(model, weights="nvfp4", fuse=False)
    lib = runtime.library_path()
    by_file = load_decode.session_model(packed, lib, Path.cwd(), use_file=True)
    by_memory = load_decode.session_model(packed, lib, Path.cwd(), use_file=False)
    try:
        assert by_memory.memory_file is not None
        _, buffer = by_memory.memory_file
        data = Path(str(by_file.model)).parent / "onnxq-decoded-weights.bin"
        assert data.read_bytes() == buffer.tobytes()[: data.stat().st_size]
    finally:
        by_file.close()
        by_memory.close()


def test_empty_weight_stays() -> None:
    """A constant Shape with a zero dim: nothing to load, the op keeps it."""
    model, _, _ = _decoder_graph(shape_input=True)
    for t in model.graph.initializer:
        if t.name == "w_shape":
            t.CopyFrom(numpy_helper.from_array(np.array([0, 32], np.int64), "w_shape"))
    assert load_decode.foldable(model) == []
