"""GatherMX on MiniLM-L3: packed weights with and without the Gather fusion, against float.

Issue 13 ("embedding lookups read only their rows"): the packed model's DequantizeMX decodes
the whole 30522 x 384 word-embedding table although a batch gathers a few rows of it. With
``fuse=True`` (the default) the graph pass turns each Gather of a packed table into a GatherMX
that decodes only the gathered rows. This script quantizes MiniLM-L3 (weights only, packed) per
format with ``fuse=False`` and ``fuse=True`` and reports, against the float model:

- latency: every model in `onnxq.runtime.session` with one intra-op thread, interleaved round by
  round in one process (the machine is shared and noisy: compare the ratios of one run). Each
  round times ``--runs`` runs of each model; the median round per model is reported, as wall
  time and as the thread's CPU time (one thread: onnxruntime runs in the calling thread), and
  as a ratio to float;
- peak RSS: each model in a fresh child process that creates the session and runs it
  ``--runs`` times (``VmHWM``), next to the child's baseline (the imports, before the session).

    python benchmarks/gather_mx.py                      # mxfp4 and uint4_block32, batch 8
    python benchmarks/gather_mx.py --formats mxfp4 --rounds 3 --runs 10

Needs the MiniLM-L3 package (tests/models/real.py ``minilm``) and the custom-op library.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


def _feeds(batch: int) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from tests.models.real import example_inputs

    return example_inputs("minilm", batch=batch)


def _session(path: str) -> Any:
    import onnxruntime as ort

    from onnxq import runtime

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return runtime.session(path, sess_options=options)


def _vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def child(path: str, batch: int, runs: int) -> None:
    """Child process: peak RSS of one model's session over ``runs`` runs (JSON on stdout)."""
    import numpy as np  # noqa: F401 - imported before the baseline, like the session's imports
    import onnxruntime  # noqa: F401

    import onnxq.runtime  # noqa: F401

    feeds = _feeds(batch)
    base = _vm_hwm()
    sess = _session(path)
    for _ in range(runs):
        sess.run(None, feeds)
    print(json.dumps({"baseline": base, "peak": _vm_hwm()}))


def _models(folder: Path, formats: list[str]) -> dict[str, Path]:
    """float, then <format> (unfused) and <format>+fused, written to ``folder``."""
    import onnx

    from onnxq.graph.quantize import quantize_model

    sys.path.insert(0, str(ROOT))
    from tests.models.real import minilm_path

    src = minilm_path()
    paths = {"float": src}
    model = onnx.load(str(src))
    for fmt in formats:
        for fuse in (False, True):
            name = f"{fmt}{'+fused' if fuse else ''}"
            out = folder / f"{name}.onnx"
            quantize_model(model, out, weights=fmt, fuse=fuse)
            paths[name] = out
    return paths


def latency(paths: dict[str, Path], batch: int, rounds: int, runs: int) -> dict[str, dict]:
    """Median per-run wall and CPU seconds of each model, interleaved round by round."""
    feeds = _feeds(batch)
    sessions = {name: _session(str(p)) for name, p in paths.items()}
    for sess in sessions.values():  # warm up
        sess.run(None, feeds)
    wall: dict[str, list[float]] = {n: [] for n in sessions}
    cpu: dict[str, list[float]] = {n: [] for n in sessions}
    for _ in range(rounds):
        for name, sess in sessions.items():
            w0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(runs):
                sess.run(None, feeds)
            wall[name].append((time.perf_counter() - w0) / runs)
            cpu[name].append((time.thread_time() - c0) / runs)
    return {n: {"wall": statistics.median(wall[n]), "cpu": statistics.median(cpu[n])} for n in wall}


def peak_rss(paths: dict[str, Path], batch: int, runs: int) -> dict[str, dict]:
    """Each model's peak RSS in a fresh child process."""
    out = {}
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for name, path in paths.items():
        cmd = [sys.executable, __file__, "--child", str(path), "--batch", str(batch)]
        cmd += ["--runs", str(runs)]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        out[name] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def main() -> int:
    """Run the benchmark and print one table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", nargs="+", default=["mxfp4", "uint4_block32"])
    parser.add_argument("--batch", type=int, default=8, help="sentences of 16 tokens (8: 128)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=20, help="runs per model per round")
    parser.add_argument("--no-rss", action="store_true", help="skip the peak-RSS children")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.batch, args.runs)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        paths = _models(Path(tmp), args.formats)
        lat = latency(paths, args.batch, args.rounds, args.runs)
        rss = {} if args.no_rss else peak_rss(paths, args.batch, args.runs)
    f_wall, f_cpu = lat["float"]["wall"], lat["float"]["cpu"]
    print(f"MiniLM-L3, batch {args.batch} x 16 tokens, 1 thread, {args.rounds} rounds x "
          f"{args.runs} runs (median round)")  # fmt: skip
    print(f"{'model':<22} {'wall ms':>8} {'x float':>8} {'cpu ms':>8} {'x float':>8}"
          f" {'peak MiB':>9} {'base MiB':>9}")  # fmt: skip
    for name, t in lat.items():
        r = rss.get(name, {})
        peak = f"{r['peak'] / MiB:9.1f}" if r else f"{'-':>9}"
        base = f"{r['baseline'] / MiB:9.1f}" if r else f"{'-':>9}"
        print(f"{name:<22} {t['wall'] * 1e3:8.2f} {t['wall'] / f_wall:8.2f} "
              f"{t['cpu'] * 1e3:8.2f} {t['cpu'] / f_cpu:8.2f} {peak} {base}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
