"""How many kernels the GPU tests compile, counted without a GPU.

Triton compiles a kernel once per specialisation: each distinct set of ``tl.constexpr`` values,
pointer element types, and int arguments not in ``do_not_specialize`` classed as 1, divisible
by 16, or other. This runs the GPU test files of ``benchmarks/gpu_check.sh`` in Triton's
interpreter with every kernel launch recorded under that key, the general engine's block
geometry set as on a GPU (the interpreter shrinks it to small tensors), and prints per kernel
the specialisations and the parameters whose values multiply them (how many would be left if
a parameter were not part of the key). The counts estimate what a GPU run compiles: the tests
pick fewer cases on a GPU in places, and a few GPU-only tests (large tensors) are skipped here.

Usage (from the repository root, torch and triton installed; about 3 minutes on 2 cores):

    python benchmarks/kernel_variants.py [--workers 2] [pytest file ...]
"""

from __future__ import annotations

import argparse
import ast
import collections
import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

GPU_TESTS = [
    "tests/cast/triton/test_fast.py",
    "tests/cast/triton/test_engine.py",
    "tests/cast/triton/test_codebook.py",
    "tests/cast/triton/test_search.py",
    "tests/cast/triton/test_cuda_aot.py",
]
_OUT_ENV = "ONNXQ_KERNEL_VARIANTS_DIR"


# -- the pytest plugin (loaded in each test process with -p kernel_variants) ---------------------
def _arg_class(name: str, value: Any, annotation: Any, unspecialised: set) -> str:
    """A launch argument as it enters Triton's compile key."""
    import torch
    import triton.language as tl

    if annotation is tl.constexpr or "constexpr" in str(annotation):
        return repr(value)
    if isinstance(value, torch.Tensor):
        return str(value.dtype)
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        width = "i32" if -(2**31) <= value < 2**31 else "i64"
        if name in unspecialised:
            return width
        return width + (":1" if value == 1 else ":16" if value % 16 == 0 else "")
    return type(value).__name__


def _install(out_dir: str) -> None:
    from triton.runtime import interpreter

    import onnxq

    assert callable(onnxq.cast)  # bind the lazy function before a submodule import rebinds it
    from onnxq.cast import triton as general

    general._interpreting = lambda: False  # the GPU's block geometry, not the interpreter's
    keys: dict[str, str] = {}
    run = interpreter.InterpretedFunction.run

    def recording_run(self: Any, *args: Any, grid: Any, warmup: Any, **kwargs: Any) -> Any:
        params = inspect.signature(self.fn).parameters
        bound = dict(zip(params, args, strict=False))
        bound.update({k: v for k, v in kwargs.items() if k in params})
        unspecialised = set(self.kwargs.get("do_not_specialize") or ())
        parts = tuple(
            (n, _arg_class(n, bound.get(n), p.annotation, unspecialised)) for n, p in params.items()
        )
        options = tuple(sorted((k, repr(v)) for k, v in kwargs.items() if k not in params))
        keys[repr((self.fn.__name__, parts, options))] = self.fn.__name__
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    interpreter.InterpretedFunction.run = recording_run

    import atexit

    path = Path(out_dir) / f"keys.{os.getpid()}.json"
    atexit.register(lambda: path.write_text(json.dumps(keys)))


if os.environ.get(_OUT_ENV):  # imported by pytest as the plugin
    _install(os.environ[_OUT_ENV])


# -- the report --------------------------------------------------------------------------------
def summarise(keys: dict[str, str]) -> str:
    """Per kernel: specialisations, and the parameters that multiply them most."""
    by_kernel: dict[str, list] = collections.defaultdict(list)
    for key in keys:
        name, parts, options = ast.literal_eval(key)
        by_kernel[name].append((parts, options))
    lines = [
        f"{len(keys)} specialisations",
        "",
        "| kernel | count | count without |",
        "|---|---|---|",
    ]
    for name, entries in sorted(by_kernel.items(), key=lambda kv: -len(kv[1])):
        params = [n for n, _ in entries[0][0]]
        drops = []
        for i, param in enumerate(params):
            if len({e[0][i][1] for e in entries}) < 2:
                continue
            left = {(tuple(p for j, p in enumerate(e[0]) if j != i), e[1]) for e in entries}
            drops.append((len(left), param))
        if len({e[1] for e in entries}) > 1:
            drops.append((len({e[0] for e in entries}), "launch options"))
        top = ", ".join(f"{p} {n}" for n, p in sorted(drops)[:5] if n < len(entries))
        lines.append(f"| `{name}` | {len(entries)} | {top or '-'} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", default=GPU_TESTS, help="test files (gpu_check.sh's)")
    ap.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (0: none)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        env = {
            **os.environ,
            "TRITON_INTERPRET": "1",
            "CUDA_VISIBLE_DEVICES": "",  # the tests' CPU cases, on a GPU machine too
            _OUT_ENV: out,
            "PYTHONPATH": os.pathsep.join(
                [str(Path(__file__).parent), os.environ.get("PYTHONPATH", ".")]
            ),
        }
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "kernel_variants", *args.files]
        if args.workers:
            cmd += ["-n", str(args.workers)]
        done = subprocess.run(cmd, env=env, check=False)
        keys: dict[str, str] = {}
        for path in Path(out).glob("keys.*.json"):
            keys.update(json.loads(path.read_text()))
    if not keys:
        print("no kernel launches were recorded", file=sys.stderr)
        return 2
    print(summarise(keys))
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
