"""Writing the build's outputs: ``kernels.bin``, ``aot_index.inc`` and ``manifest.json``.

``kernels.bin`` holds the constant tables and every image (a cubin per architecture and the
PTX), each 64-byte aligned; ``aot_index.inc`` is the C++ table the launcher
(``ops/src/cuda_launch.cc``) reads: formats, kernels, the role of every kernel parameter.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from onnxq.cast.aot_spec import (
    ARCHS,
    CB_INNER_OPS,
    CB_OPS,
    FLOATS,
    FORMAT_VERSION,
    MODE_PARAMS,
    MODES,
    OP_GATHER_ROWS,
    OP_PACK,
    OP_UNPACK,
    PTX_ARCH,
    ROLE_IDS,
    FormatInfo,
    GenerationError,
    KernelSpec,
)

_Span = tuple[int, int]  # (offset, bytes) in kernels.bin
_BYTE_OPS = (OP_PACK, OP_UNPACK, OP_GATHER_ROWS)  # io_type: a number (bits), no float type


def _c_str(s: str) -> str:
    return json.dumps(s)


@dataclasses.dataclass
class _Blob:
    """kernels.bin being laid out: the bytes, the constants' and the images' spans."""

    data: bytearray = dataclasses.field(default_factory=bytearray)
    consts: list[_Span] = dataclasses.field(default_factory=list)
    placed: dict[str, tuple[dict[int, _Span], _Span]] = dataclasses.field(default_factory=dict)

    def put(self, data: bytes) -> _Span:
        """Append ``data`` 64-byte aligned; return its span."""
        while len(self.data) % 64:
            self.data.append(0)
        off = len(self.data)
        self.data.extend(data)
        return off, len(data)


def _layout_blob(consts: list[bytes], units: list[str], results: dict) -> _Blob:
    blob = _Blob()
    blob.consts = [blob.put(c) for c in consts]
    for u in units:
        images = {a: blob.put(results[(u, a)]["cubin"]) for a in ARCHS}
        blob.placed[u] = (images, blob.put(results[(u, PTX_ARCH)]["ptx"]))
    extras = {results[key]["extra_params"] for key in results}
    if len(extras) != 1 or extras.pop() > 2:
        # Triton keeps every run-time argument and appends its scratch pointers; anything else
        # would shift the parameters the launcher passes
        raise GenerationError(f"kernels disagree on trailing parameters: {sorted(extras)}")
    return blob


def _kernel_tables(
    kernels: list[KernelSpec],
    formats: list[FormatInfo],
    units: list[str],
    results: dict,
    blob: _Blob,
) -> tuple[list[str], list[tuple[int, int]], list[dict[str, Any]]]:
    """The launcher's kernel rows, the parameter table and the manifest's kernel entries."""
    rows, params, entries = [], [], []
    for k in kernels:
        r = {a: results[(k.unit, a)] for a in ARCHS}
        nextra = r[ARCHS[0]]["extra_params"]
        warps = {x["num_warps"] for x in r.values()}
        if any(x["extra_params"] != nextra for x in r.values()) or len(warps) != 1:
            raise GenerationError(f"{k.symbol}: the architectures disagree on the parameters")
        first = len(params)
        params.extend((ROLE_IDS[role], extra) for _, role, extra in k.roles)
        params.extend([(ROLE_IDS["scratch"], -1)] * nextra)
        images, ptx = blob.placed[k.unit]
        bt = k.constexprs.get("ROUNDS", k.constexprs.get("BT", 1))  # amax: blocks per program
        # codebook decoding: the block (NSUB x SUB elements a tile) the launcher chooses by
        cb = k.op in CB_OPS or k.op in CB_INNER_OPS.values()
        block = (k.constexprs["NSUB"], k.constexprs["SUB"]) if cb else (0, 0)
        cubins = ", ".join(f"{{{a}, {images[a][0]}u, {images[a][1]}u}}" for a in ARCHS)
        rows.append(
            f"  {{{k.fmt}, {k.op}, {k.io_type}, {_c_str(r[ARCHS[0]]['name'])}, {warps.pop()}, "
            f"{max(x['shared'] for x in r.values())}, {bt}, {k.chunk}, {int(bool(k.hints))}, "
            f"{block[0]}, {block[1]}, {first}, "
            f"{len(params) - first}, {{{cubins}}}, {{{PTX_ARCH}, {ptx[0]}u, {ptx[1]}u}}}},"
            f"  // {k.symbol}"
        )
        entries.append(
            {
                "symbol": k.symbol,
                "kernel": k.kernel,
                "module": k.module,
                "op": k.op,
                "format": formats[k.fmt].preset if k.fmt >= 0 else None,
                "io_type": k.io_type if k.op in _BYTE_OPS else FLOATS[k.io_type],
                "constexprs": k.constexprs,
                "options": k.options,
                "signature": k.signature,
                "hints": list(k.hints),
                "roles": [[n, r_, x] for n, r_, x in k.roles],
                "image": units.index(k.unit),
                "cubin": {f"sm_{a}": list(images[a]) for a in ARCHS},
                "ptx": {f"sm_{PTX_ARCH}": list(ptx)},
                "num_warps": r[ARCHS[0]]["num_warps"],
                "extra_params": nextra,
            }
        )
    return rows, params, entries


def _mode_rows(f: FormatInfo) -> str:
    """AotFormat's mode tables (cuda_launch.h), in `MODE_PARAMS` order."""
    rows = []
    for mode, param in MODE_PARAMS.items():
        values = f.modes[param]
        if len(values) != len(MODES[mode]):
            raise GenerationError(f"{f.preset}: {len(values)} values of {param}")
        rows.append("{" + ", ".join(str(v) for v in values) + "}")
    return ", ".join(rows)


def _index_inc(
    formats: list[FormatInfo],
    rows: list[str],
    params: list[tuple[int, int]],
    blob: _Blob,
    triton_version: str,
    amax_programs: int,
) -> str:
    """The text of aot_index.inc."""
    fmt_rows = [
        f"  {{{_c_str(f.preset)}, {_c_str(f.code)}, {f.tile}, {f.sub}, {int(f.scaled)}, "
        f"{f.code_bits}, {f.scale_bits}, {f.tenscale_bits}, {_mode_rows(f)}}},"
        for f in formats
    ]
    param_rows = [
        "  " + " ".join(f"{{{role}, {extra}}}," for role, extra in params[i : i + 8])
        for i in range(0, len(params), 8)
    ]
    const_rows = [f"  {{{o}u, {n}u}}," for o, n in blob.consts]
    return "\n".join(
        [
            "// Generated by onnxq/cast/aot.py; do not edit. Included by ops/src/cuda_launch.cc.",
            f"#define ONNXQ_AOT_FORMAT_VERSION {FORMAT_VERSION}",
            f"#define ONNXQ_AOT_TRITON_VERSION {_c_str(triton_version)}",
            f"#define ONNXQ_AOT_BLOB_BYTES {len(blob.data)}u",
            f"#define ONNXQ_AOT_NARCH {len(ARCHS)}",
            f"#define ONNXQ_AOT_AMAX_PROGRAMS {amax_programs}",
            "static const AotFormat kAotFormats[] = {",
            *fmt_rows,
            "};",
            "static const AotParam kAotParams[] = {",
            *param_rows,
            "};",
            "static const AotSpan kAotConsts[] = {",
            *(const_rows or ["  {0u, 0u},"]),
            "};",
            "static const AotKernel kAotKernels[] = {",
            *rows,
            "};",
            "",
        ]
    )


def write_outputs(
    out: Path,
    stamp: str,
    specs: tuple[list[FormatInfo], list[KernelSpec], list[bytes]],
    units: list[str],
    results: dict,
    triton_version: str,
    amax_programs: int,
) -> dict[str, Any]:
    """Write kernels.bin, aot_index.inc and manifest.json into ``out``; return the manifest."""
    formats, kernels, consts = specs
    blob = _layout_blob(consts, units, results)
    rows, params, entries = _kernel_tables(kernels, formats, units, results, blob)
    inc = _index_inc(formats, rows, params, blob, triton_version, amax_programs)
    (out / "kernels.bin").write_bytes(bytes(blob.data))
    (out / "aot_index.inc").write_text(inc)
    manifest = {
        "stamp": stamp,
        "format_version": FORMAT_VERSION,
        "triton": triton_version,
        "archs": [f"sm_{a}" for a in ARCHS],
        "ptx_arch": f"sm_{PTX_ARCH}",
        "blob_bytes": len(blob.data),
        "images": len(units),
        "formats": [dataclasses.asdict(f) for f in formats],
        "kernels": entries,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str))
    return manifest
