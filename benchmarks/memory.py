"""Peak memory of `quantize_model` on a model with more than 3 GB of external weights.

Issue 4: "weights are processed one at a time, so peak memory stays under the size of the
largest tensor times a small factor plus the graph". This script

1. generates, tensor by tensor (the generator holds one weight at a time), a float32 MLP:
   ``--layers`` MatMul weights of ``--dim`` x ``--dim`` (default 12 x 8192 x 8192 = 12 x 256 MiB
   = 3 GiB) plus small biases, all in one external data file;
2. quantizes it in a fresh child process per case (``weights="mxfp4"`` packed, and
   ``weights="mxfp8e4", weight_storage="fake"``, whose > 2 GB output needs external data) and
   reads the child's peak resident set (``VmHWM``, also ``ru_maxrss``);
3. prints total and largest weight bytes, the peak, peak / largest tensor, the peak above the
   child's baseline (Python + numpy + onnx + onnxq imported), output sizes and wall time.

    python benchmarks/memory.py                # 3 GiB model in a temp dir, deleted at the end
    python benchmarks/memory.py --keep --workdir /tmp/mem   # keep the files
    python benchmarks/memory.py --layers 2 --dim 1024       # quick check

Exit status 1 when a case's peak exceeds ``--factor`` x the largest tensor plus the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MiB = 1 << 20
CASES = {
    "mxfp4-packed": {"weights": "mxfp4"},
    "mxfp8e4-fake": {"weights": "mxfp8e4", "weight_storage": "fake"},
}


def generate(folder: Path, layers: int, dim: int, seed: int = 0) -> tuple[Path, int, int]:
    """Write ``mlp.onnx`` and ``mlp.onnx.data``; return (path, weight bytes, largest bytes)."""
    import numpy as np
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    path = folder / "mlp.onnx"
    location = "mlp.onnx.data"
    inits: list[TensorProto] = []
    nodes = []
    total = largest = 0
    rows = max(1, (16 * MiB) // (4 * dim))  # write 16 MiB at a time

    def external(name: str, dims: list[int], offset: int, length: int) -> TensorProto:
        t = TensorProto(name=name, dims=dims, data_type=TensorProto.FLOAT)
        t.data_location = TensorProto.EXTERNAL
        for key, value in (
            ("location", location),
            ("offset", str(offset)),
            ("length", str(length)),
        ):
            t.external_data.add(key=key, value=value)
        return t

    with open(folder / location, "wb") as f:
        x = "x"
        for i in range(layers):
            offset = f.tell()
            for start in range(0, dim, rows):
                n = min(rows, dim - start)
                block = rng.standard_normal((n, dim), dtype=np.float32) * (1.0 / dim**0.5)
                f.write(block.tobytes())
            length = f.tell() - offset
            inits.append(external(f"w{i}", [dim, dim], offset, length))
            total += length
            largest = max(largest, length)
            pad = (-f.tell()) % 4096
            f.write(b"\0" * pad)
            offset = f.tell()
            f.write((rng.standard_normal(dim, dtype=np.float32) * 0.01).tobytes())
            inits.append(external(f"b{i}", [dim], offset, 4 * dim))
            f.write(b"\0" * ((-f.tell()) % 4096))
            nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"mm{i}"], name=f"mm{i}"))
            out = "y" if i == layers - 1 else f"h{i}"
            if i == layers - 1:
                nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], [out], name=f"add{i}"))
            else:
                nodes.append(
                    helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"a{i}"], name=f"add{i}")
                )
                nodes.append(helper.make_node("Relu", [f"a{i}"], [out], name=f"relu{i}"))
            x = out
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, dim])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    path.write_bytes(model.SerializeToString())
    return path, total, largest


def _hwm_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def child(args: argparse.Namespace) -> None:
    """Run in a fresh process: quantize (or only import, for the baseline); print JSON."""
    import resource

    import onnx  # noqa: F401

    import onnxq
    from onnxq.graph.quantize import quantize_model

    onnxq.cast  # noqa: B018  (imported like in the real run)
    result: dict[str, object] = {}
    if args.case != "baseline":
        t0 = time.perf_counter()
        quantize_model(args.model, args.out, **CASES[args.case])
        result["wall_s"] = time.perf_counter() - t0
    result["vmhwm"] = _hwm_kib() * 1024
    result["maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(result))


def _files(out: Path) -> dict[str, int]:
    return {
        f.name: f.stat().st_size
        for f in sorted(out.parent.iterdir())
        if f.name.startswith(out.name)
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workdir", help="folder for the model and outputs (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--layers", type=int, default=12, help="MatMul weights (default 12)")
    ap.add_argument("--dim", type=int, default=8192, help="each weight is dim x dim (8192)")
    ap.add_argument(
        "--factor",
        type=float,
        default=4.0,
        help="allowed peak above baseline, in largest tensors (default 4)",
    )
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    ap.add_argument("--child", dest="case", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        child(args)
        return 0

    made = args.workdir is None
    work = Path(args.workdir or tempfile.mkdtemp(prefix="onnxq-mem-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    failed = False
    try:
        t0 = time.perf_counter()
        model, total, largest = generate(work, args.layers, args.dim)
        gen_s = time.perf_counter() - t0
        print(
            f"model: {model} ({args.layers} x {args.dim}x{args.dim} float32, generated in "
            f"{gen_s:.1f} s)"
        )
        print(f"total weight bytes:   {total:>14,d} ({total / MiB:,.0f} MiB)")
        print(f"largest tensor bytes: {largest:>14,d} ({largest / MiB:,.0f} MiB)")
        me = [sys.executable, os.path.abspath(__file__)]

        def run(case: str, out: Path | None) -> dict[str, float]:
            cmd = [*me, "--child", case, "--model", str(model)]
            if out is not None:
                cmd += ["--out", str(out)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"{case} failed:\n{done.stderr[-4000:]}")
            return json.loads(done.stdout.strip().splitlines()[-1])

        base = run("baseline", None)["vmhwm"]
        print(f"child baseline (imports only): {base / MiB:,.0f} MiB")
        print()
        header = (
            f"{'case':<14} {'peak RSS MiB':>12} {'peak/largest':>12} "
            f"{'(peak-base)/largest':>19} {'wall s':>7}  output files"
        )
        print(header)
        for case in [c for c in args.cases.split(",") if c]:
            out = work / f"out-{case}.onnx"
            r = run(case, out)
            peak = r["vmhwm"]
            ratio = peak / largest
            above = (peak - base) / largest
            files = ", ".join(f"{k} {v / MiB:,.1f} MiB" for k, v in _files(out).items())
            print(
                f"{case:<14} {peak / MiB:>12,.0f} {ratio:>12.2f} {above:>19.2f} "
                f"{r['wall_s']:>7.1f}  {files}"
            )
            if peak > base + args.factor * largest:
                failed = True
                print(f"  NOT BOUNDED: peak exceeds baseline + {args.factor:g} x largest tensor")
            if not args.keep:
                for f in list(work.iterdir()):
                    if f.name.startswith(out.name):
                        f.unlink()  # free the disk before the next case
    finally:
        if args.keep:
            print(f"kept {work}")
        elif made:
            shutil.rmtree(work, ignore_errors=True)
        else:
            for f in work.iterdir():
                if f.name.startswith(("mlp.onnx", "out-")):
                    f.unlink()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
