"""Small float models made in code with seeded random weights, for the quantizer's tests.

Each builder returns ``(model, inputs)``: an opset-21 ``onnx.ModelProto`` with static shapes
and a dict of example inputs. Weight shapes are multiples of 32 where a reduction runs, so
every preset tiles them, but some are not (the CNN's 3 input channels) to exercise padding.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["BUILDERS", "cnn", "embedding", "gru", "if_constant", "lstm", "mlp", "transformer"]

Built = tuple[onnx.ModelProto, dict[str, np.ndarray]]
_F = TensorProto.FLOAT


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _w(rng: np.random.Generator, shape: tuple[int, ...], name: str) -> onnx.TensorProto:
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    data = rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))
    return numpy_helper.from_array(data.astype(np.float32), name)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    inits: list[onnx.TensorProto],
    name: str,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def mlp(width: int = 64, layers: int = 2, batch: int = 4, seed: int = 0) -> Built:
    """MatMul + Add + Relu layers, then a Gemm head (transB=1), float32.

    Args:
        width: the hidden width (and input width).
        layers: MatMul layers before the head.
        batch: rows of the example input.
        seed: weight and input seed.
    """
    rng = _rng(seed)
    nodes, inits = [], []
    x = "x"
    for i in range(layers):
        inits += [_w(rng, (width, width), f"w{i}"), _w(rng, (width,), f"b{i}")]
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"mm{i}"], name=f"layer{i}/matmul"),
            helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"add{i}"], name=f"layer{i}/add"),
            helper.make_node("Relu", [f"add{i}"], [f"h{i}"], name=f"layer{i}/relu"),
        ]
        x = f"h{i}"
    inits += [_w(rng, (16, width), "head_w"), _w(rng, (16,), "head_b")]
    nodes.append(helper.make_node("Gemm", [x, "head_w", "head_b"], ["y"], name="head", transB=1))
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", _F, [batch, width])],
        [helper.make_tensor_value_info("y", _F, [batch, 16])],
        inits,
        "mlp",
    )
    return model, {"x": rng.standard_normal((batch, width)).astype(np.float32)}


def cnn(seed: int = 1) -> Built:
    """Conv (3 -> 32) + Relu, Conv (32 -> 32), ConvTranspose (32 -> 8), float32."""
    rng = _rng(seed)
    inits = [
        _w(rng, (32, 3, 3, 3), "conv0_w"),
        _w(rng, (32,), "conv0_b"),
        _w(rng, (32, 32, 3, 3), "conv1_w"),
        _w(rng, (32, 8, 2, 2), "deconv_w"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv0_w", "conv0_b"], ["c0"], name="conv0", pads=[1] * 4),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
        helper.make_node("Conv", ["r0", "conv1_w"], ["c1"], name="conv1", pads=[1] * 4),
        helper.make_node("ConvTranspose", ["c1", "deconv_w"], ["y"], name="deconv", strides=[2, 2]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", _F, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", _F, [1, 8, 16, 16])],
        inits,
        "cnn",
    )
    return model, {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}


def transformer(seq: int = 8, dim: int = 64, heads: int = 2, seed: int = 2) -> Built:
    """One transformer encoder block, batch 1.

    LayerNorm, Q/K/V projections, attention (Softmax), out projection, residual, LayerNorm,
    MLP (MatMul, Relu, MatMul), residual.
    """
    rng = _rng(seed)
    hd = dim // heads
    inits = [_w(rng, (dim, dim), n) for n in ("wq", "wk", "wv", "wo")]
    inits += [_w(rng, (dim, 2 * dim), "w1"), _w(rng, (2 * dim, dim), "w2")]
    inits += [
        numpy_helper.from_array(np.ones(dim, np.float32), "ln_g"),
        numpy_helper.from_array(np.zeros(dim, np.float32), "ln_b"),
        numpy_helper.from_array(np.array([seq, heads, hd], np.int64), "split_shape"),
        numpy_helper.from_array(np.array([seq, dim], np.int64), "merge_shape"),
        numpy_helper.from_array(np.array(1 / np.sqrt(hd), np.float32), "scale"),
    ]
    n = helper.make_node
    nodes = [
        n("LayerNormalization", ["x", "ln_g", "ln_b"], ["ln0"], name="ln0", axis=-1),
        n("MatMul", ["ln0", "wq"], ["q"], name="attn/q"),
        n("MatMul", ["ln0", "wk"], ["k"], name="attn/k"),
        n("MatMul", ["ln0", "wv"], ["v"], name="attn/v"),
    ]
    for t in ("q", "k", "v"):
        nodes += [
            n("Reshape", [t, "split_shape"], [f"{t}_r"], name=f"attn/{t}_reshape"),
            n("Transpose", [f"{t}_r"], [f"{t}_h"], name=f"attn/{t}_heads", perm=[1, 0, 2]),
        ]
    nodes += [
        n("Transpose", ["k_h"], ["k_t"], name="attn/k_t", perm=[0, 2, 1]),
        n("MatMul", ["q_h", "k_t"], ["scores"], name="attn/scores"),
        n("Mul", ["scores", "scale"], ["scaled"], name="attn/scale"),
        n("Softmax", ["scaled"], ["probs"], name="attn/softmax", axis=-1),
        n("MatMul", ["probs", "v_h"], ["ctx_h"], name="attn/context"),
        n("Transpose", ["ctx_h"], ["ctx_t"], name="attn/merge", perm=[1, 0, 2]),
        n("Reshape", ["ctx_t", "merge_shape"], ["ctx"], name="attn/merge_reshape"),
        n("MatMul", ["ctx", "wo"], ["attn_out"], name="attn/out"),
        n("Add", ["x", "attn_out"], ["res0"], name="res0"),
        n("LayerNormalization", ["res0", "ln_g", "ln_b"], ["ln1"], name="ln1", axis=-1),
        n("MatMul", ["ln1", "w1"], ["f1"], name="ffn/up"),
        n("Relu", ["f1"], ["f1r"], name="ffn/relu"),
        n("MatMul", ["f1r", "w2"], ["f2"], name="ffn/down"),
        n("Add", ["res0", "f2"], ["y"], name="res1"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", _F, [seq, dim])],
        [helper.make_tensor_value_info("y", _F, [seq, dim])],
        inits,
        "transformer",
    )
    return model, {"x": rng.standard_normal((seq, dim)).astype(np.float32)}


def if_constant(dim: int = 32, seed: int = 3) -> Built:
    """Weights in `Constant` nodes and `If` branches, shared, and behind a Transpose.

    Both branches of the `If` hold a weight, one branch reads an outer-scope weight, one
    weight feeds two MatMuls and one is reached through a Transpose.

    Quantizable weights: ``const_w`` (Constant, main graph), ``shared_w`` (two consumers),
    ``wt`` (through a Transpose: quantized along its axis 1), ``then_w`` (then-branch
    initializer), ``else_w`` (Constant inside the else branch), ``outer_w`` (main graph,
    read in the then branch): 6.
    """
    rng = _rng(seed)
    n = helper.make_node
    const_w = _w(rng, (dim, dim), "const_w_value")
    else_w = _w(rng, (dim, dim), "else_w_value")
    then_graph = helper.make_graph(
        [
            n("MatMul", ["h2", "then_w"], ["t0"], name="then/matmul"),
            n("MatMul", ["t0", "outer_w"], ["then_out"], name="then/outer"),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("then_out", _F, [2, dim])],
        [_w(rng, (dim, dim), "then_w")],
    )
    else_graph = helper.make_graph(
        [
            n("Constant", [], ["else_w"], name="else/const", value=else_w),
            n("MatMul", ["h2", "else_w"], ["else_out"], name="else/matmul"),
        ],
        "else",
        [],
        [helper.make_tensor_value_info("else_out", _F, [2, dim])],
    )
    nodes = [
        n("Constant", [], ["const_w"], name="const", value=const_w),
        n("MatMul", ["x", "const_w"], ["h0"], name="main/const_matmul"),
        n("MatMul", ["h0", "shared_w"], ["h1"], name="main/shared_a"),
        n("MatMul", ["h1", "shared_w"], ["h1b"], name="main/shared_b"),
        n("Transpose", ["wt"], ["wt_t"], name="main/transpose", perm=[1, 0]),
        n("MatMul", ["h1b", "wt_t"], ["h2"], name="main/transposed"),
        n("If", ["cond"], ["y"], name="branch", then_branch=then_graph, else_branch=else_graph),
    ]
    inits = [
        _w(rng, (dim, dim), "shared_w"),
        _w(rng, (dim, dim), "wt"),
        _w(rng, (dim, dim), "outer_w"),
    ]
    model = _model(
        nodes,
        [
            helper.make_tensor_value_info("x", _F, [2, dim]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", _F, [2, dim])],
        inits,
        "if_constant",
    )
    return model, {
        "x": rng.standard_normal((2, dim)).astype(np.float32),
        "cond": np.array(True),
    }


def _recurrent(op: str, gates: int, seed: int, hidden: int = 32, features: int = 32) -> Built:
    rng = _rng(seed)
    seq, batch = 5, 2
    inits = [
        _w(rng, (1, gates * hidden, features), "W"),
        _w(rng, (1, gates * hidden, hidden), "R"),
        _w(rng, (1, 2 * gates * hidden), "B"),
    ]
    node = helper.make_node(
        op, ["x", "W", "R", "B"], ["y", "y_h"], name=op.lower(), hidden_size=hidden
    )
    model = _model(
        [node],
        [helper.make_tensor_value_info("x", _F, [seq, batch, features])],
        [
            helper.make_tensor_value_info("y", _F, [seq, 1, batch, hidden]),
            helper.make_tensor_value_info("y_h", _F, [1, batch, hidden]),
        ],
        inits,
        op.lower(),
    )
    return model, {"x": rng.standard_normal((seq, batch, features)).astype(np.float32)}


def lstm(seed: int = 4) -> Built:
    """One forward LSTM layer (W [1, 4H, I], R [1, 4H, H], hidden 32)."""
    return _recurrent("LSTM", 4, seed)


def gru(seed: int = 5) -> Built:
    """One forward GRU layer (W [1, 3H, I], R [1, 3H, H], hidden 32)."""
    return _recurrent("GRU", 3, seed)


def embedding(vocab: int = 100, dim: int = 64, seed: int = 6) -> Built:
    """Gather on an embedding table [vocab, dim], then a MatMul projection."""
    rng = _rng(seed)
    inits = [_w(rng, (vocab, dim), "table"), _w(rng, (dim, 32), "proj")]
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed", axis=0),
        helper.make_node("MatMul", ["emb", "proj"], ["y"], name="proj"),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 6])],
        [helper.make_tensor_value_info("y", _F, [2, 6, 32])],
        inits,
        "embedding",
    )
    return model, {"ids": rng.integers(0, vocab, (2, 6)).astype(np.int64)}


BUILDERS: dict[str, Callable[[], Built]] = {
    "mlp": mlp,
    "cnn": cnn,
    "transformer": transformer,
    "if_constant": if_constant,
    "lstm": lstm,
    "gru": gru,
    "embedding": embedding,
}
