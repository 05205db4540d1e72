"""Ahead-of-time compilation of the Triton cast kernels for the C library's CUDA path.

The library (``ops/``) launches the *same* kernels as `onnxq.cast.triton` and
`onnxq.cast.triton_fast` through the CUDA driver API, without Python: quantize through the fast
kernel (`triton_fast._fast_kernel`, and `_amax_kernel` for NVFP4's tensor amax) when the last
axis is a multiple of the tile, through the general kernels otherwise; dequantize and the bit
packing through the general ones. This module compiles them at build time:

1. For each specialisation (`PRESETS` x input/output float types, tiles along the last axis
   and, for the general kernels, along an axis with elements after it; the default modes:
   round even, scale floor, nan element), the host functions
   `triton.quantize` / `triton.dequantize` / `triton_fast.quantize` are called on small CPU
   tensors with their kernels replaced by recorders. The recorded launch gives every
   constexpr value and the type of every pointer argument, so nothing of the kernels'
   parameter lists is copied here; a change in the host code is picked up by the next build.
   Two shapes are recorded and must agree (checks that the constexprs do not depend on the
   shape, and that the scalar arguments follow `_geometry` / `_fast_geometry`, which the C++
   launcher computes the same way).
2. Each specialisation is compiled with ``triton.compile`` for sm_80 and sm_90 (cubin) plus
   PTX for sm_80 (loaded through the driver's JIT on newer GPUs), with floating-point fusion
   off. Chosen here rather than recorded: the general kernels' ``BT`` (tile instances per
   program), which the host itself shrinks for small tensors and which changes no result
   (`ELEMS_PER_PROGRAM` keeps the cubins small); the fast kernel's ``HW_BF16`` (True: the
   recording may run in the interpreter, the images convert in hardware); the amax kernel's
   ``ROUNDS`` (the host's grows with the tensor: `AMAX_ROUNDS` are compiled). The fast
   kernel's program size is the host's tuned one (``triton_fast._BLOCK`` / ``_WARPS``).
3. ``kernels.bin`` (all images and constant tables), ``aot_index.inc`` (the C++ table the
   launcher reads: formats, kernels, the role of every kernel parameter) and ``manifest.json``
   are written to the output folder. A stamp of the inputs (this module, the Triton engine,
   the format code, the Triton version) skips the work when nothing changed.

Pointer and scalar arguments are matched to what the launcher passes by name (`_ROLES`): a
parameter added to a kernel without a role here stops the build with a message naming it.

The parts: `aot_spec` (formats, operations, parameter roles, `KernelSpec`), `aot_launches`
(recording the host's launches), `aot_record` (every specialisation from them:
`specialisations`), `aot_compile` (``triton.compile``) and
`aot_emit` (the output files); this module runs them and is the command line.

Run: ``python -m onnxq.cast.aot OUT_DIR [--jobs N]`` (``ops/CMakeLists.txt`` does, through
``ops/gen_aot.py``, when triton and torch import).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from onnxq.cast.aot_compile import _cached_specs, compile_all, compile_spec
from onnxq.cast.aot_emit import write_outputs
from onnxq.cast.aot_record import specialisations
from onnxq.cast.aot_spec import (
    _ROLES,
    AMAX_ROUNDS,
    ARCHS,
    CB_BLOCKS,
    CB_INNER_OPS,
    CB_OPS,
    ELEMS_PER_PROGRAM,
    FAST_OPS,
    FLOATS,
    FORMAT_VERSION,
    OP_AMAX,
    OP_DEQUANT,
    OP_FAST_CODES,
    OP_FAST_CODES_INNER,
    OP_FAST_PACKED,
    OP_FAST_VALUES,
    OP_FAST_VALUES_INNER,
    OP_GATHER_ROWS,
    OP_PACK,
    OP_QUANT_BOTH,
    OP_QUANT_CODES,
    OP_QUANT_VALUES,
    OP_STATS,
    OP_UNPACK,
    PACK_WIDTHS,
    PRESETS,
    PTX_ARCH,
    ROLE_IDS,
    FormatInfo,
    GenerationError,
    KernelSpec,
)

__all__ = [
    "AMAX_ROUNDS",
    "ARCHS",
    "CB_BLOCKS",
    "CB_INNER_OPS",
    "CB_OPS",
    "ELEMS_PER_PROGRAM",
    "FAST_OPS",
    "FLOATS",
    "OP_AMAX",
    "OP_DEQUANT",
    "OP_FAST_CODES",
    "OP_FAST_CODES_INNER",
    "OP_FAST_PACKED",
    "OP_FAST_VALUES",
    "OP_FAST_VALUES_INNER",
    "OP_GATHER_ROWS",
    "OP_PACK",
    "OP_QUANT_BOTH",
    "OP_QUANT_CODES",
    "OP_QUANT_VALUES",
    "OP_STATS",
    "OP_UNPACK",
    "PACK_WIDTHS",
    "PRESETS",
    "ROLE_IDS",
    "_ROLES",
    "FormatInfo",
    "GenerationError",
    "KernelSpec",
    "compile_spec",
    "generate",
    "main",
    "specialisations",
]

# The sources the kernels and their specialisations come from (with the format code)
_SOURCES = (
    "aot",
    "aot_compile",
    "aot_emit",
    "aot_launches",
    "aot_record",
    "aot_spec",
    "triton",
    "triton_bits",
    "triton_codebook",
    "triton_codebook_device",
    "triton_codebook_kernels",
    "triton_device",
    "triton_fast",
    "triton_fast_kernel",
    "triton_gather",
    "triton_kernels",
    "triton_pack",
    "triton_plan",
    "triton_quant_kernel",
    "triton_tiles",
    "elements",
    "layout",
    "reference",
    "packing",
)


def _stamp(presets: tuple[str, ...]) -> str:
    """Hash of everything the output depends on (sources, Triton version, settings)."""
    from importlib import metadata

    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    h.update(repr((FORMAT_VERSION, presets, ARCHS, PTX_ARCH, ELEMS_PER_PROGRAM)).encode())
    h.update(metadata.version("triton").encode())
    files = [here / f"{n}.py" for n in _SOURCES] + sorted((here.parent / "formats").glob("*.py"))
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _amax_programs() -> int:
    from onnxq.cast import triton_fast

    return int(triton_fast._AMAX_PROGRAMS)


def generate(
    out_dir: str | os.PathLike[str],
    *,
    jobs: int = 0,
    presets: tuple[str, ...] = PRESETS,
    force: bool = False,
) -> dict[str, Any]:
    """Write kernels.bin, aot_index.inc and manifest.json into ``out_dir``; return the manifest.

    Specialisations that differ only in run-time values share one compiled image.

    Raises:
        GenerationError: a specialisation cannot be recorded or compiled.
        ImportError: torch or triton is missing.
    """
    if os.environ.pop("TRITON_INTERPRET", "0") == "1" and "triton" in sys.modules:
        raise GenerationError("triton was imported with TRITON_INTERPRET=1: nothing to compile")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = _stamp(presets)
    manifest_path = out / "manifest.json"
    if not force and manifest_path.is_file() and (out / "aot_index.inc").is_file():
        old = json.loads(manifest_path.read_text())
        if old.get("stamp") == stamp and (out / "kernels.bin").is_file():
            return old
    import triton

    specs = _cached_specs(presets)
    units = list(dict.fromkeys(k.unit for k in specs[1]))
    results = compile_all(presets, units, jobs)
    return write_outputs(out, stamp, specs, units, results, triton.__version__, _amax_programs())


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m onnxq.cast.aot OUT_DIR [--jobs N] [--force]``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--jobs", type=int, default=0, help="compile processes (0: one per core)")
    ap.add_argument("--force", action="store_true", help="ignore the up-to-date stamp")
    args = ap.parse_args(argv)
    try:
        m = generate(args.out_dir, jobs=args.jobs, force=args.force)
    except ImportError as err:
        print(f"onnxq aot: no GPU kernels ({err})", file=sys.stderr)
        return 3
    print(
        f"onnxq aot: {len(m['kernels'])} kernels ({m['images']} images) for "
        f"{', '.join(m['archs'])} (+ PTX {m['ptx_arch']}), {m['blob_bytes']} bytes, "
        f"triton {m['triton']}, in {args.out_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
