"""Where an onnxruntime QuantizeMX + DequantizeMX session spends its time, per format.

On a 4096x4096 float32 tensor (``--size``), each column the best of ``--repeat`` timed runs
after one warm-up, as a multiple of ``np.copyto`` into a preallocated array:

- ``quant``: a one-node QuantizeMX session, outputs bound to preallocated arrays (io binding);
- ``dequant``: a one-node DequantizeMX session fed the codes of ``quant``, Y bound to a
  preallocated array;
- ``qdq``: QuantizeMX + DequantizeMX in one session, Y bound to a preallocated array;
- ``qdq run``: the same session through plain ``sess.run`` (numpy allocates and copies Y);
- ``native``: ``onnxq.cast(x, fmt, backend="native")`` for comparison (not with ``--cpu-time``).

``--cpu-time``: one intra-op thread and the CPU time of the calling thread (``time.thread_time``)
instead of wall time, for a machine shared with other work, where wall times swing by 2x.

Usage: python benchmarks/session_parts.py [--size 4096] [--repeat 5] [--formats mxfp4 ...]
       [--cpu-time]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kernels  # benchmarks/kernels.py: FORMATS, best, qdq_model, cpu_name

import onnxq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--formats", nargs="*", default=None)
    parser.add_argument("--cpu-time", action="store_true", help="one thread, thread CPU time")
    args = parser.parse_args()
    clock = time.thread_time if args.cpu_time else time.perf_counter

    def best(fn: Callable[[], Any], repeat: int) -> float:
        fn()
        times = []
        for _ in range(repeat):
            t0 = clock()
            fn()
            times.append(clock() - t0)
        return min(times)

    def session(model: Any) -> Any:
        import onnxruntime as ort

        so = ort.SessionOptions()
        if args.cpu_time:
            so.intra_op_num_threads = 1
        return runtime.session(model, sess_options=so)

    from onnx import TensorProto, helper

    from onnxq import runtime

    rng = np.random.default_rng(0)
    shape = (args.size, args.size)
    x = rng.standard_normal(shape, dtype=np.float32)
    dst = np.empty_like(x)
    copy = best(lambda: np.copyto(dst, x), args.repeat * 2)
    print(f"CPU: {kernels.cpu_name()} ({os.cpu_count()} logical cores); tensor {shape} float32")
    if args.cpu_time:
        print("one intra-op thread; CPU time of the calling thread")
    print(f"np.copyto: {copy * 1e3:.2f} ms; other columns as multiples of it")
    print(f"{'format':<26} {'quant':>7} {'dequant':>8} {'qdq':>7} {'qdq run':>8} {'native':>7}")
    for name in args.formats or kernels.FORMATS:
        (q_node, dq_node), names = kernels.qdq_model(name, shape, parts=True)
        opsets = [helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
        outs = [n for n in names if n]
        q_model = helper.make_model(
            helper.make_graph(
                [q_node],
                "q",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outs],
            ),
            opset_imports=opsets,
        )
        q_sess = session(q_model)
        q_vals = dict(zip(outs, q_sess.run(outs, {"x": x}), strict=True))
        q_bind = q_sess.io_binding()
        q_bind.bind_cpu_input("x", x)
        q_outs = {n: np.empty_like(q_vals[n]) for n in outs}  # kept alive while bound
        for n, v in q_outs.items():
            q_bind.bind_output(n, "cpu", 0, v.dtype, v.shape, v.ctypes.data)
        t_q = best(lambda s=q_sess, b=q_bind: s.run_with_iobinding(b), args.repeat)

        dq_in = [n for n in dq_node.input if n]
        dq_model = helper.make_model(
            helper.make_graph(
                [dq_node],
                "dq",
                [
                    helper.make_tensor_value_info(n, TensorProto.UNDEFINED, list(q_vals[n].shape))
                    for n in dq_in
                ],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
            ),
            opset_imports=opsets,
        )
        for vi, n in zip(dq_model.graph.input, dq_in, strict=True):
            vi.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(q_vals[n].dtype)
        dq_sess = session(dq_model)
        y = np.empty_like(x)
        dq_bind = dq_sess.io_binding()
        for n in dq_in:
            dq_bind.bind_cpu_input(n, q_vals[n])
        dq_bind.bind_output("y", "cpu", 0, np.float32, shape, y.ctypes.data)
        t_dq = best(lambda s=dq_sess, b=dq_bind: s.run_with_iobinding(b), args.repeat)

        qdq = session(kernels.qdq_model(name, shape))
        bind = qdq.io_binding()
        bind.bind_cpu_input("x", x)
        bind.bind_output("y", "cpu", 0, np.float32, shape, y.ctypes.data)
        t_qdq = best(lambda s=qdq, b=bind: s.run_with_iobinding(b), args.repeat)
        t_run = best(lambda s=qdq: s.run(None, {"x": x}), args.repeat)
        # native uses the library's own threads, which the calling thread's CPU time misses.
        t_nat = (
            None
            if args.cpu_time
            else best(lambda n=name: onnxq.cast(x, n, backend="native"), args.repeat)
        )
        cols = [t_q, t_dq, t_qdq, t_run, t_nat]
        print(
            f"{name:<26} "
            + " ".join(
                f"{'-':>{w + 1}}" if t is None else f"{t / copy:>{w}.2f}x"
                for t, w in zip(cols, [6, 7, 6, 7, 6], strict=True)
            )
        )


if __name__ == "__main__":
    main()
