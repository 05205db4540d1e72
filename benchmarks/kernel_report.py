"""What the fast Triton kernel compiles to on a GPU, without one: memory instructions and
registers of one cast's kernel for sm_90, compiled on the CPU machine.

Triton compiles for a CUDA target without a device; `ptxas` (shipped with triton) assembles
the PTX and reports registers and spills. The counts are per thread and static (the kernel
has no loops over its block): global loads and stores by width, shared-memory traffic and
barriers (layout conversions through shared memory), warp shuffles and `ttg.convert_layout`
operations in the TTGIR. They explain timings; they are not timings (see `gpu.py`).

Usage (from the repository root, torch and triton installed):

    python benchmarks/kernel_report.py mxfp6e2 bfloat16 compress [--pack-group load] [--save DIR]

``compress`` is the packed-codes kernel, ``virtual`` the values kernel; ``--pack-group`` sets
``ONNXQ_TRITON_PACK_GROUP`` for the recording (default: the library's choice).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU, do not interpret

SHAPE = (8192, 8192)  # its sizes are multiples of 16, as the JIT's specialisation assumes


def record(preset: str, ftype: str, mode: str) -> Any:
    """The fast kernel's recorded launch for one cast (`onnxq.cast.aot_launches`)."""
    from onnxq.cast import aot_launches, triton_fast
    from onnxq.formats.datatype import datatype

    want = {"compress": "packed", "virtual": "values"}[mode]
    # the recorder pins the default packing for the embedded kernels; here the knob decides
    with _knob_respected(aot_launches):
        launches = aot_launches.record_fast(triton_fast, datatype(preset), SHAPE, ftype, want)
    return next(la for la in launches if la.kernel.fn.__name__ == "_fast_kernel")


@contextlib.contextmanager
def _knob_respected(aot_launches: Any) -> Any:
    saved = aot_launches.default_packing
    aot_launches.default_packing = contextlib.nullcontext
    try:
        yield
    finally:
        aot_launches.default_packing = saved


def compile_sm90(launch: Any) -> Any:
    """Compile a recorded launch for sm_90 as the AOT build describes it (`aot_record.
    _describe`), with the JIT's hints: 16-byte aligned pointers, and integers that are
    multiples of 16 marked so (the JIT specialises them the same way; the AOT build does not)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from onnxq.cast import aot_record

    signature, constexprs, options, roles = aot_record._describe(launch, {}, [], tenscale=True)
    constexprs["HW_BF16"] = True  # the interpreter's switch; the GPU converts in hardware
    names = list(launch.kernel.arg_names)
    hinted = [n for n, t in signature.items() if t.startswith("*")]
    hinted += [n for n, role, value in roles if role == "value" and isinstance(value, int)
               and signature[n] == "i32" and value % 16 == 0]  # fmt: skip
    target = GPUTarget("cuda", 90, 32)
    backend = triton.compiler.make_backend(target)
    parsed = backend.parse_options(options)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in hinted}
    src = triton.compiler.ASTSource(
        fn=launch.kernel, signature=signature, constexprs=constexprs, attrs=attrs
    )
    return triton.compile(src, target=target, options=parsed.__dict__)


def ptxas_report(ptx: str) -> str:
    """Registers and spills from the ptxas that triton ships (empty when it is absent)."""
    import tempfile

    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not ptxas.exists():
        return ""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        # sm_90a: the target Triton's PTX names for sm_90 features
        src.write_text(re.sub(r"^\.target sm_90$", ".target sm_90a", ptx, flags=re.M))
        proc = subprocess.run(
            [str(ptxas), "-arch=sm_90a", "-v", str(src), "-o", str(Path(tmp) / "k.cubin")],
            capture_output=True,
            text=True,
            check=False,
        )
    lines = [ln.split("info    : ")[-1].strip() for ln in proc.stderr.splitlines()]
    return "; ".join(ln for ln in lines if "registers" in ln or "spill" in ln)


def report(ck: Any) -> dict[str, Any]:
    """Static per-thread counts of the compiled kernel."""
    ttgir, ptx = ck.asm["ttgir"], ck.asm["ptx"]
    return {
        "warps": ck.metadata.num_warps,
        "shared_bytes": ck.metadata.shared,
        "convert_layout": ttgir.count("ttg.convert_layout"),
        "global_loads": dict(collections.Counter(re.findall(r"\bld\.global[.\w]*", ptx))),
        "global_stores": dict(collections.Counter(re.findall(r"\bst\.global[.\w]*", ptx))),
        "st_shared": len(re.findall(r"\bst\.shared", ptx)),
        "ld_shared": len(re.findall(r"\bld\.shared", ptx)),
        "bar_sync": len(re.findall(r"\bbar\.sync", ptx)),
        "shuffles": len(re.findall(r"\bshfl\.sync", ptx)),
        "ptxas": ptxas_report(ptx),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", help="a fast-path format, e.g. mxfp6e2, nvfp4, mx6")
    parser.add_argument("dtype", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("mode", choices=("compress", "virtual"))
    parser.add_argument("--pack-group", help="ONNXQ_TRITON_PACK_GROUP for the recording")
    parser.add_argument("--save", type=Path, help="write kernel.ttgir and kernel.ptx here")
    args = parser.parse_args(argv)
    if args.pack_group is not None:
        os.environ["ONNXQ_TRITON_PACK_GROUP"] = args.pack_group
    from onnxq.cast.aot_spec import GenerationError

    try:
        launch = record(args.preset, args.dtype, args.mode)
    except (ValueError, GenerationError) as err:  # an unknown format, one the fast path refuses
        print(f"kernel_report: {err}", file=sys.stderr)
        return 2
    ck = compile_sm90(launch)
    keys = ("BT", "TC", "G3", "P_GROUP", "P_UNIT", "P_UNITS")
    print({k: launch.kwargs[k] for k in keys if k in launch.kwargs})
    for key, value in report(ck).items():
        print(f"{key}: {value}")
    if args.save:
        args.save.mkdir(parents=True, exist_ok=True)
        (args.save / "kernel.ttgir").write_text(ck.asm["ttgir"])
        (args.save / "kernel.ptx").write_text(ck.asm["ptx"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
