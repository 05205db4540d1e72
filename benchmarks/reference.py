"""Virtual-cast time of the numpy reference engine on a 4096x4096 float32 tensor, per preset.

Usage: python benchmarks/reference.py [--size 4096] [--repeat 3] [--json out.json]
Target (issue 2): under 2 s per preset on the 2-core development machine.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import onnxq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096, help="rows and columns of the tensor")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per preset (best kept)")
    parser.add_argument("--presets", nargs="*", default=None, help="presets to time (default: all)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.size, args.size), dtype=np.float32)
    names = args.presets or [*list(onnxq.datatypes()), "cb41fi_e2m2fnuz_e8m0_t32"]
    copy_times = []
    for _ in range(args.repeat):
        dst = np.empty_like(x)
        t0 = time.perf_counter()
        np.copyto(dst, x)
        copy_times.append(time.perf_counter() - t0)
    copy = min(copy_times)
    print(f"{'preset':<28} {'seconds':>8} {'x np.copyto':>12}")
    results = {"shape": list(x.shape), "copyto_s": copy, "presets": {}}
    for name in names:
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            onnxq.cast(x, name, backend="reference")
            times.append(time.perf_counter() - t0)
        best = min(times)
        results["presets"][name] = best
        flag = "" if best < 2.0 else "  (over the 2 s target)"
        print(f"{name:<28} {best:8.3f} {best / copy:12.0f}{flag}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
