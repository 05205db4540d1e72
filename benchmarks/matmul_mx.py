"""MatMulMX against float MatMul, DequantizeMX + MatMul and onnxruntime's MatMulNBits.

The layers of a small LM's single-token decode step (SmolLM2-135M: hidden 576, intermediate
1536, 3 key/value heads of 64: per layer q 576x576, k and v 576x192, o 576x576, gate and up
576x1536, down 1536x576; ``--layers`` of them, 30 by default, each with its own random
weights), as one onnxruntime model per variant whose A is ``[M, 576]`` (``[M, 1536]`` for the
down projections) and whose outputs are the 7 x layers products:

- ``float``: MatMul on float32 weights;
- ``dq+mm <fmt>``: DequantizeMX (constant weights decoded once at session creation,
  ``ONNXQ_CONST_DECODE=1``) + MatMul;
- ``mmx <fmt>``: MatMulMX on the packed weights;
- ``nbits``: onnxruntime's com.microsoft MatMulNBits (4 bits, block 32, symmetric, made by
  ``MatMulNBitsQuantizer``; ``nbits acc4``: the same with ``accuracy_level=4``, int8 compute).

Then the tied LM head (``--vocab``, default 49152; 0 skips it): A ``[M, 576]`` times B = W^T for
one table W ``[vocab, 576]`` tiled along its last axis (K), as the SmolLM2 export reads it:

- ``float``: MatMul on the float B (the transposed table, as onnxruntime folds it);
- ``dq+tr+mm <fmt>``: DequantizeMX(W) -> Transpose -> MatMul, decoded on every run (the
  unfused tied table: its decode also feeds the Gather, so it is not kept decoded);
- ``mmx-t <fmt>``: MatMulMX ``trans_b=1`` on W's packed inputs;
- ``nbits`` / ``nbits acc4``: MatMulNBits on B (4 bits, block 32 along K).

For each M (``--m``, default 1 and 32) and intra-op thread count (``--threads``, default 1 and
2), the variants run interleaved (one run of each per round, ``--rounds`` rounds after a
warm-up) and each reports its median wall time and the ratio to float's in the same rounds.
With one thread the median CPU time of the calling thread (``time.thread_time``) is reported
too: on a shared machine it is the steadier number.

Usage: python benchmarks/matmul_mx.py [--layers 30] [--m 1 32] [--threads 1 2] [--rounds 30]
       [--formats mxfp4 nvfp4 uint4_block32] [--vocab 49152]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxq
from onnxq import runtime

HIDDEN, INTER, KV = 576, 1536, 192
LAYER = [  # (name, K, N)
    ("q", HIDDEN, HIDDEN),
    ("k", HIDDEN, KV),
    ("v", HIDDEN, KV),
    ("o", HIDDEN, HIDDEN),
    ("gate", HIDDEN, INTER),
    ("up", HIDDEN, INTER),
    ("down", INTER, HIDDEN),
]
SLOTS = ("Q", "Scale", "Zero", "TenScale", "Meta", "Mask")


def weights(layers: int, seed: int = 0) -> list[tuple[str, np.ndarray]]:
    """One random float32 weight [K, N] per projection of every layer."""
    rng = np.random.default_rng(seed)
    return [
        (f"l{i}_{name}", (rng.standard_normal((k, n), np.float32) * 0.05))
        for i in range(layers)
        for name, k, n in LAYER
    ]


def _graph(nodes: list[Any], inits: list[Any], m: int, names: list[str], opsets: list[Any]) -> Any:
    inputs = [
        helper.make_tensor_value_info("a_h", TensorProto.FLOAT, [m, HIDDEN]),
        helper.make_tensor_value_info("a_i", TensorProto.FLOAT, [m, INTER]),
    ]
    outputs = [helper.make_tensor_value_info(f"y_{n}", TensorProto.FLOAT, None) for n in names]
    graph = helper.make_graph(nodes, "lm_step", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=opsets)


def _a(name: str) -> str:
    return "a_i" if name.endswith("_down") else "a_h"


def float_model(ws: list[tuple[str, np.ndarray]], m: int) -> onnx.ModelProto:
    """MatMul on float weights."""
    nodes = [helper.make_node("MatMul", [_a(n), f"w_{n}"], [f"y_{n}"]) for n, _ in ws]
    inits = [numpy_helper.from_array(w, f"w_{n}") for n, w in ws]
    return _graph(nodes, inits, m, [n for n, _ in ws], [helper.make_opsetid("", 17)])


def packed_model(ws: list[tuple[str, np.ndarray]], m: int, dt: str, fused: bool) -> onnx.ModelProto:
    """MatMulMX (fused) or DequantizeMX + MatMul on the packed weights."""
    nodes, inits = [], []
    for n, w in ws:
        q = onnxq.cast(w, dt, axis=0, mode="compress")
        fields = {"Q": q.data, "Scale": q.scale, "Zero": q.zero, "TenScale": q.tenscale}
        fields.update({"Meta": q.meta, "Mask": q.mask})
        names = []
        for key in SLOTS:
            if fields.get(key) is not None:
                inits.append(
                    numpy_helper.from_array(np.ascontiguousarray(fields[key]), f"{key}_{n}")
                )
                names.append(f"{key}_{n}")
            else:
                names.append("")
        while not names[-1]:
            names.pop()
        attrs = {"dtype": dt, "axis": 0, "shape": list(w.shape)}
        if fused:
            nodes.append(
                helper.make_node("MatMulMX", [_a(n), *names], [f"y_{n}"], domain="onnxq", **attrs)
            )
        else:
            nodes.append(
                helper.make_node("DequantizeMX", names, [f"b_{n}"], domain="onnxq", **attrs)
            )
            nodes.append(helper.make_node("MatMul", [_a(n), f"b_{n}"], [f"y_{n}"]))
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("onnxq", 1)]
    return _graph(nodes, inits, m, [n for n, _ in ws], opsets)


def lm_head_models(
    m: int, vocab: int, formats: list[str], dq_format: str
) -> dict[str, tuple[onnx.ModelProto, bool]]:
    """The tied LM head's variants: {name: (model, needs the custom ops)}."""
    table = np.random.default_rng(7).standard_normal((vocab, HIDDEN), np.float32) * 0.05
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("onnxq", 1)]
    b = numpy_helper.from_array(np.ascontiguousarray(table.T), "w_head")
    fm = _graph(
        [helper.make_node("MatMul", ["a_h", "w_head"], ["y_head"])], [b], m, ["head"], opsets[:1]
    )
    models: dict[str, tuple[onnx.ModelProto, bool]] = {"float": (fm, False)}
    for dt, fused in [(dq_format, False)] + [(f, True) for f in formats]:
        q = onnxq.cast(table, dt, axis=1, mode="compress")
        fields = {"Q": q.data, "Scale": q.scale, "Zero": q.zero, "TenScale": q.tenscale}
        fields.update({"Meta": q.meta, "Mask": q.mask})
        names = [f"{k}_head" if fields.get(k) is not None else "" for k in SLOTS]
        while not names[-1]:
            names.pop()
        inits = [
            numpy_helper.from_array(np.ascontiguousarray(fields[k]), f"{k}_head")
            for k in SLOTS
            if fields.get(k) is not None
        ]
        attrs = {"dtype": dt, "axis": 1, "shape": [vocab, HIDDEN]}
        if fused:
            nodes = [
                helper.make_node(
                    "MatMulMX", ["a_h", *names], ["y_head"], domain="onnxq", trans_b=1, **attrs
                )
            ]
            models[f"mmx-t {dt}"] = (_graph(nodes, inits, m, ["head"], opsets), True)
        else:
            nodes = [
                helper.make_node("DequantizeMX", names, ["table"], domain="onnxq", **attrs),
                helper.make_node("Transpose", ["table"], ["b_head"], perm=[1, 0]),
                helper.make_node("MatMul", ["a_h", "b_head"], ["y_head"]),
            ]
            models[f"dq+tr+mm {dt}"] = (_graph(nodes, inits, m, ["head"], opsets), True)
    models["nbits"] = (nbits_model(fm, None), False)
    models["nbits acc4"] = (nbits_model(fm, 4), False)
    return models


def nbits_model(float_m: onnx.ModelProto, accuracy_level: int | None) -> onnx.ModelProto:
    """onnxruntime's MatMulNBits (4 bits, block 32, symmetric) from the float model."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    kwargs: dict[str, Any] = {"block_size": 32, "is_symmetric": True}
    if accuracy_level is not None:
        kwargs["accuracy_level"] = accuracy_level
    work = onnx.ModelProto()
    work.CopyFrom(float_m)  # the quantizer rewrites its model in place
    quant = MatMulNBitsQuantizer(work, **kwargs)
    quant.process()
    return quant.model.model


def session(model: onnx.ModelProto, threads: int, custom: bool) -> Any:
    """A session with `threads` intra-op threads (the onnxq custom ops when `custom`)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    if custom:
        return runtime.session(model, sess_options=so)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def measure(sessions: dict[str, Any], m: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Interleaved runs: {variant: (median wall s, median thread CPU s)}."""
    rng = np.random.default_rng(1)
    feed = {
        "a_h": rng.standard_normal((m, HIDDEN), np.float32),
        "a_i": rng.standard_normal((m, INTER), np.float32),
    }
    for s in sessions.values():
        s.run(None, feed)
    wall: dict[str, list[float]] = {k: [] for k in sessions}
    cpu: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(rounds):
        for name, s in sessions.items():
            t0, c0 = time.perf_counter(), time.thread_time()
            s.run(None, feed)
            cpu[name].append(time.thread_time() - c0)
            wall[name].append(time.perf_counter() - t0)
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in sessions}


def main() -> None:
    """Build the variants, measure them and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--m", type=int, nargs="*", default=[1, 32])
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--formats", nargs="*", default=["mxfp4", "nvfp4", "uint4_block32"])
    parser.add_argument("--dq-format", default="mxfp4", help="format of the dq+mm variant")
    parser.add_argument("--vocab", type=int, default=49152, help="LM head rows (0: skip it)")
    parser.add_argument("--no-layers", action="store_true", help="only the LM head")
    args = parser.parse_args()
    logging.disable(logging.INFO)  # the quantizer logs every node
    ws = weights(args.layers)
    for m in args.m:
        if not args.no_layers:
            print(f"\n{args.layers} layers, {sum(w.size for _, w in ws) / 1e6:.1f} M weights")
            fm = float_model(ws, m)
            models: dict[str, tuple[onnx.ModelProto, bool]] = {"float": (fm, False)}
            models[f"dq+mm {args.dq_format}"] = (packed_model(ws, m, args.dq_format, False), True)
            for dt in args.formats:
                models[f"mmx {dt}"] = (packed_model(ws, m, dt, True), True)
            models["nbits"] = (nbits_model(fm, None), False)
            models["nbits acc4"] = (nbits_model(fm, 4), False)
            # dq+mm: the weights decoded at session creation
            _report(models, m, args.threads, args.rounds, const_decode="1")
        if args.vocab:
            print(f"\nLM head: [{m}, {HIDDEN}] x W^T, W [{args.vocab}, {HIDDEN}] tiled along K")
            head = lm_head_models(m, args.vocab, args.formats, args.dq_format)
            # dq+tr+mm: a tied table's decode is not kept (it feeds the Gather too)
            _report(head, m, args.threads, args.rounds, const_decode="0")


def _report(
    models: dict[str, tuple[onnx.ModelProto, bool]],
    m: int,
    threads_list: list[int],
    rounds: int,
    const_decode: str,
) -> None:
    """Measure the variants interleaved and print the table, per thread count."""
    os.environ["ONNXQ_CONST_DECODE"] = const_decode  # read when a session is created
    for threads in threads_list:
        sessions = {k: session(mod, threads, custom) for k, (mod, custom) in models.items()}
        res = measure(sessions, m, rounds)
        fw, fc = res["float"]
        print(f"M={m}, {threads} thread(s), {rounds} rounds (median)")
        print(f"{'variant':<22}{'wall ms':>10}{'x float':>9}{'cpu ms':>10}{'x float':>9}")
        for k, (w, c) in res.items():
            cpu = f"{c * 1e3:>10.2f}{c / fc:>9.2f}" if threads == 1 else ""
            print(f"{k:<22}{w * 1e3:>10.2f}{w / fw:>9.2f}{cpu}")
        del sessions


if __name__ == "__main__":
    main()
