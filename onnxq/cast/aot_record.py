"""Every specialisation the CUDA path compiles, from the host's recorded launches.

For each preset and float type, the host functions are called on small CPU tensors with their
kernels replaced by recorders (`onnxq.cast.aot_launches`): a recorded launch gives every
constexpr value and the type of every pointer argument, so no kernel's parameter list is copied
here. Two shapes are recorded and must agree.
"""

from __future__ import annotations

import itertools
import struct
from typing import Any

from onnxq.cast.aot_launches import (
    Launch,
    default_packing,
    mode_table,
    named,
    record_dequant,
    record_fast,
    record_quant,
    recording,
)
from onnxq.cast.aot_spec import (
    _OPTION_DEFAULTS,
    _PTR_TYPES,
    _REQUIRED,
    _ROLES,
    AMAX_ROUNDS,
    CB_BLOCKS,
    CB_INNER_OPS,
    CB_MAX_TILE,
    ELEMS_PER_PROGRAM,
    FAST_OPS,
    FLOATS,
    INNER_OPS,
    OP_AMAX,
    OP_CB_LONG,
    OP_CB_SUB,
    OP_DEQUANT,
    OP_DEQUANT_INNER,
    OP_FAST_CODES_INNER,
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
    FormatInfo,
    GenerationError,
    KernelSpec,
    _fast_geometry,
    _stats_geometry,
    cb_geometry,
)
from onnxq.formats.datatype import datatype


def _ptr_type(t: Any) -> str:
    name = str(t.dtype)
    if name not in _PTR_TYPES:
        raise GenerationError(f"no Triton pointer type for a {name} kernel argument")
    return "*" + _PTR_TYPES[name]


def _bits32(value: int | float) -> int:
    if isinstance(value, float):
        return struct.unpack("<i", struct.pack("<f", value))[0]
    return int(value)


def _constexpr_names(fn: Any) -> set[str]:
    names = list(fn.arg_names)
    if hasattr(fn, "constexprs"):
        return {names[i] for i in fn.constexprs}
    import inspect  # an interpreted function: read the annotations

    params = inspect.signature(fn.fn).parameters.values()
    return {p.name for p in params if "constexpr" in str(p.annotation)}


def _describe(
    launch: Launch, geometry: dict[str, int], consts: list[bytes], *, tenscale: bool
) -> tuple[dict[str, str], dict[str, Any], dict[str, Any], list[tuple[str, str, int]]]:
    """Signature, constexprs, compile options and parameter roles of one recorded launch."""
    import torch

    fn = launch.kernel
    kname = fn.fn.__name__
    table = _ROLES.get(kname, {})
    names = list(fn.arg_names)
    constexpr_names = _constexpr_names(fn)
    if len(launch.args) > len(names):
        raise GenerationError(f"{kname}: {len(launch.args)} positional arguments")
    bound = dict(zip(names, launch.args, strict=False))
    options = dict(_OPTION_DEFAULTS)
    for key, value in launch.kwargs.items():
        if key in names:
            bound[key] = value
        else:
            options[key] = value  # a launch option (num_warps, enable_fp_fusion, ...)
    options["enable_fp_fusion"] = False
    missing = [n for n in names if n not in bound]
    if missing:
        raise GenerationError(f"{kname}: parameters {missing} not passed by the host")
    signature: dict[str, str] = {}
    roles: list[tuple[str, str, int]] = []
    constexprs: dict[str, Any] = {}
    for name in names:
        value = bound[name]
        if name in constexpr_names:
            constexprs[name] = value
            signature[name] = "constexpr"
        elif isinstance(value, torch.Tensor):
            signature[name] = _ptr_type(value)
            role = table.get(name)
            if role is None:
                raise GenerationError(
                    f"{kname}: pointer parameter {name!r} has no role in onnxq/cast/aot.py "
                    f"(_ROLES); say what the C launcher passes for it"
                )
            if role == "ts" and not tenscale:
                role = "const"  # the unused 1.0 of a format without a tensor scale
            extra = -1
            if role == "const":
                data = value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
                if data not in consts:
                    consts.append(data)
                extra = consts.index(data)
            roles.append((name, role, extra))
        elif isinstance(value, bool):
            raise GenerationError(f"{kname}: run-time parameter {name!r} is a bool")
        elif isinstance(value, float):
            signature[name] = "fp32"
            roles.append((name, "value", _bits32(value)))
        elif isinstance(value, int):
            if not -(1 << 31) <= value < (1 << 31):
                raise GenerationError(f"{kname}: scalar {name} = {value} needs 64 bits")
            signature[name] = "i32"
            if name in geometry:
                if geometry[name] != value:
                    raise GenerationError(
                        f"{kname}: scalar {name} = {value} where the launcher computes "
                        f"{geometry[name]}"
                    )
                roles.append((name, name, -1))
            else:
                roles.append((name, "value", value))
        else:
            raise GenerationError(f"{kname}: run-time parameter {name!r} is {value!r}")
    for key, want in _REQUIRED.items():
        if key in constexprs and bool(constexprs[key]) != want:
            raise GenerationError(f"{kname}: constexpr {key} = {constexprs[key]}")
    return signature, constexprs, options, roles


def _same(a: tuple, b: tuple, what: str) -> None:
    """Two recorded launches (different shapes) must differ only in geometry and ``BT``."""
    sig_a, ce_a, opt_a, roles_a = a
    sig_b, ce_b, opt_b, roles_b = b
    diff = sorted(k for k in set(ce_a) | set(ce_b) if k != "BT" and ce_a.get(k) != ce_b.get(k))
    if sig_a != sig_b or opt_a != opt_b:
        diff.append("signature or options")
    va = [(n, r, x) for n, r, x in roles_a if r == "value"]
    vb = [(n, r, x) for n, r, x in roles_b if r == "value"]
    if va != vb:
        diff += sorted(
            {n for n, _, _ in va} ^ {n for n, _, _ in vb}
            | {x[0] for x, y in zip(va, vb, strict=False) if x != y}
        )
    if diff:
        raise GenerationError(f"{what}: {diff} depend on the tensor shape")


_SHAPES = ((512, 96), (3, 5, 40))  # recorded and compared; the first is the one compiled
# Tiles along axis 1 with elements after it (the general kernels' LAST=False compile)
_INNER_SHAPES = ((4, 96, 7), (3, 40, 2, 5))
# (operation, shapes, axis) of the general kernels: tiles along the last axis, along another
_VARIANTS = ((False, _SHAPES, -1), (True, _INNER_SHAPES, 1))
_FAST_SHAPES = ((512, 96), (3, 5, 64))  # the last axis a multiple of every preset's tile
_FAST_INNER_SHAPES = ((4, 64, 7), (3, 32, 2, 5))  # whole tiles along axis 1


def _format_info(tm: Any, preset: str) -> tuple[Any, FormatInfo]:
    """The data type of ``preset`` and what the launcher needs to know about it.

    Raises:
        GenerationError: a format the launcher does not handle.
    """
    dt = datatype(preset)
    p = tm.plan(_SHAPES[0], dt, -1)
    s = dt.sspec
    if s is None or not p.single or p.inner != 1 or getattr(p, "rows", 0):
        raise GenerationError(f"{preset}: only scaled formats with short 1-D tiles")
    if s.zero is not None:
        raise GenerationError(f"{preset}: zero points")
    if s.tenscale is not None and (not s.tenscale.is_float or s.tenscale.bits != 32):
        raise GenerationError(f"{preset}: tensor scales other than float32")
    if dt.nspec.bits > 8 or s.scale.bits > 8:
        raise GenerationError(f"{preset}: codes or scales of more than 8 bits")
    info = FormatInfo(
        preset,
        dt.code,
        p.TC,
        p.sub,
        True,
        dt.nspec.bits,
        s.scale.bits,
        s.tenscale.bits if s.tenscale is not None else 0,
        mode_table(tm, dt, preset, _SHAPES[0]),
    )
    return dt, info


def _variant(
    launches: list[Launch],
    shapes: tuple[tuple[int, ...], ...],
    axis: int,
    info: FormatInfo,
    consts: list[bytes],
    what: str,
) -> tuple[dict[str, str], dict[str, Any], dict[str, Any], list[tuple[str, str, int]]]:
    """One general kernel's compile from its launches for ``shapes`` (tiles along ``axis``).

    The launches must agree but for the geometry, and LAST must say whether the axis is last;
    the quantize kernel's mode parameters take the launcher's roles (recorded at the defaults).
    """
    has_ts = info.tenscale_bits > 0
    d = [
        _describe(la, info.geometry(shape, axis) | info.mode_numbers(), consts, tenscale=has_ts)
        for la, shape in zip(launches, shapes, strict=True)
    ]
    _same(d[0], d[1], what)
    sig, ce, opts, roles = d[0]
    if ce.get("LAST") != (axis == -1):
        raise GenerationError(f"{what}: LAST = {ce.get('LAST')} for axis {axis}")
    _set_bt(ce)
    return sig, ce, opts, roles


def _quant_specs(
    tm: Any, dt: Any, info: FormatInfo, fi: int, k: int, consts: list[bytes]
) -> list[KernelSpec]:
    """The general quantize kernel for one format and input type: values, codes, both.

    Each for tiles along the last axis and along an axis with elements after it.
    """
    preset, ftype, has_ts = info.preset, FLOATS[k], info.tenscale_bits > 0
    specs = []
    quants = ((OP_QUANT_VALUES, "values"), (OP_QUANT_CODES, "codes"), (OP_QUANT_BOTH, "both"))
    for inner, shapes, axis in _VARIANTS:
        for op, want in quants:
            rec = [record_quant(tm, dt, shape, ftype, want, axis) for shape in shapes]
            mains = [named(r, "_quant_kernel") for r in rec]
            if [len(m) for m in mains] != [1, 1]:
                raise GenerationError(f"{preset}: expected one _quant_kernel launch")
            extra = [la.kernel.fn.__name__ for la in rec[0] if la not in mains[0]]
            if extra != (["_stats_kernel"] if has_ts else []):
                raise GenerationError(f"{preset}: unexpected launches {extra}")
            parts = _variant(
                [m[0] for m in mains], shapes, axis, info, consts, f"{preset} quantize"
            )
            op = INNER_OPS[op] if inner else op
            specs.append(KernelSpec(f"q{op}_{preset}_{ftype}", "_quant_kernel", op, fi, k, *parts))
    return specs


def _fast_specs(
    tf: Any, dt: Any, info: FormatInfo, fi: int, k: int, consts: list[bytes], amax: bool
) -> list[KernelSpec]:
    """The fast kernel for one format and input type (and with ``amax``, the amax kernels)."""
    preset, ftype, has_ts = info.preset, FLOATS[k], info.tenscale_bits > 0
    specs = []
    variants = [(op, want, _FAST_SHAPES, -1) for op, want in FAST_OPS]
    variants.append((OP_FAST_VALUES_INNER, "values", _FAST_INNER_SHAPES, 1))
    variants.append((OP_FAST_CODES_INNER, "codes", _FAST_INNER_SHAPES, 1))
    for op, want, shapes, axis in variants:
        if want == "packed" and info.code_bits == 8 and not info.sub:
            continue  # the packed layouts are the unpacked ones: OP_FAST_CODES
        rec = [record_fast(tf, dt, shape, ftype, want, axis) for shape in shapes]
        mains = [named(r, "_fast_kernel") for r in rec]
        if [len(m) for m in mains] != [1, 1]:
            raise GenerationError(f"{preset}: expected one _fast_kernel launch")
        extra = [la.kernel.fn.__name__ for la in rec[0] if la not in mains[0]]
        if extra != (["_amax_kernel"] if has_ts else []):
            raise GenerationError(f"{preset}: unexpected fast launches {extra}")
        d = [
            _describe(
                m[0], _fast_geometry(shape, info, want == "packed", axis), consts, tenscale=has_ts
            )
            for m, shape in zip(mains, shapes, strict=True)
        ]
        _same(d[0], d[1], f"{preset} fast {want}")
        sig, ce, opts, roles = d[0]
        if ce.get("HW_BF16") is None or ce.get("BT", 0) * ce.get("TC", 0) < 1:
            raise GenerationError(f"{preset}: fast kernel constexprs {sorted(ce)}")
        if ce.get("INNER") != (axis != -1):
            raise GenerationError(f"{preset}: fast kernel INNER = {ce.get('INNER')}, axis {axis}")
        ce["HW_BF16"] = True  # the interpreter's switch; the images convert in hardware
        specs.append(
            KernelSpec(
                f"f{op}_{preset}_{ftype}",
                "_fast_kernel",
                op,
                fi,
                k,
                sig,
                ce,
                opts,
                roles,
                module="onnxq.cast.triton_fast",
                hints=_ptrs(sig),
            )
        )
        if has_ts and amax:
            amax = False
            specs.extend(_amax_specs(tf, rec[0], k, consts))
    return specs


def _stats_spec(tm: Any, dt: Any, k: int, consts: list[bytes]) -> KernelSpec:
    """The statistics kernel for one input type (the tensor amax of tensor-scale formats)."""
    ftype = FLOATS[k]
    d = []
    for size in (1 << 16, 3 * (1 << 16) + 5):
        st = named(record_quant(tm, dt, (size,), ftype, "values", -1), "_stats_kernel")
        if len(st) != 1:
            raise GenerationError("expected one _stats_kernel launch (tensor amax)")
        tile = st[0].kwargs.get("TILE", 0)
        d.append(_describe(st[0], _stats_geometry(size, tile), consts, tenscale=False))
    _same(d[0], d[1], "stats")
    sig, ce, opts, roles = d[0]
    if ce.get("BT") != 1 or not ce.get("LAST"):
        raise GenerationError(f"stats kernel constexprs {ce}: not one chunk each")
    return KernelSpec(
        f"stats_{ftype}", "_stats_kernel", OP_STATS, -1, k, sig, ce, opts, roles, chunk=ce["TILE"]
    )


def _dequant_specs(
    tm: Any, dt: Any, info: FormatInfo, fi: int, k: int, consts: list[bytes]
) -> list[KernelSpec]:
    """The dequantize kernel for one format and output type, both kinds of axis."""
    preset, ftype = info.preset, FLOATS[k]
    specs = []
    for inner, shapes, axis in _VARIANTS:
        rec = [record_dequant(tm, dt, shape, ftype, axis) for shape in shapes]
        if [len(r) for r in rec] != [1, 1]:
            raise GenerationError(f"{preset}: expected one _dequant_kernel launch")
        parts = _variant([r[0] for r in rec], shapes, axis, info, consts, f"{preset} dequantize")
        op = OP_DEQUANT_INNER if inner else OP_DEQUANT
        sym = f"dq{'i' if inner else ''}_{preset}_{ftype}"
        specs.append(KernelSpec(sym, "_dequant_kernel", op, fi, k, *parts))
    return specs


def specialisations(
    presets: tuple[str, ...] = PRESETS,
) -> tuple[list[FormatInfo], list[KernelSpec], list[bytes]]:
    """Record every specialisation: the formats, the kernels and the constant tables.

    Raises:
        GenerationError: the host code launches something this module cannot reproduce.
        ImportError: torch or triton is missing.
    """
    from onnxq.cast import triton as tm
    from onnxq.cast import triton_fast as tf

    formats: list[FormatInfo] = []
    kernels: list[KernelSpec] = []
    consts: list[bytes] = []
    stats_done: set[int] = set()
    amax_done: set[int] = set()
    for preset in presets:
        dt, info = _format_info(tm, preset)
        fi = len(formats)
        formats.append(info)
        has_ts = info.tenscale_bits > 0
        for k in range(len(FLOATS)):
            kernels.extend(_quant_specs(tm, dt, info, fi, k, consts))
            kernels.extend(_fast_specs(tf, dt, info, fi, k, consts, amax=k not in amax_done))
            if has_ts:
                amax_done.add(k)
            if has_ts and k not in stats_done:
                stats_done.add(k)
                kernels.append(_stats_spec(tm, dt, k, consts))
            kernels.extend(_dequant_specs(tm, dt, info, fi, k, consts))
    kernels.extend(_cb_specs(consts))
    kernels.extend(_pack_specs())
    kernels.append(_gather_spec())
    return formats, kernels, consts


def _amax_specs(tf: Any, launches: list[Launch], k: int, consts: list[bytes]) -> list[KernelSpec]:
    """NVFP4's tensor amax for the fast path: one image per `AMAX_ROUNDS` value.

    The host picks ``ROUNDS`` (blocks per program, a loop count) from the tensor size so that
    about ``_AMAX_PROGRAMS`` programs run; the launcher takes the largest compiled value that
    does not exceed the host's, so it runs at most twice as many programs (atomics) as the
    host below about 5e8 elements, 8x at 2^31.
    """
    am = [la for la in launches if la.kernel.fn.__name__ == "_amax_kernel"]
    if len(am) != 1:
        raise GenerationError("expected one _amax_kernel launch (tensor amax)")
    numel = am[0].args[2] if len(am[0].args) > 2 else am[0].kwargs.get("numel")
    sig, ce, opts, roles = _describe(am[0], {"numel": int(numel)}, consts, tenscale=False)
    if set(ce) != {"IN_KIND", "BLOCK", "ROUNDS"} or ce["IN_KIND"] != k:
        raise GenerationError(f"amax kernel constexprs {ce}")
    specs = []
    for rounds in AMAX_ROUNDS:
        c = {**ce, "ROUNDS": rounds}
        specs.append(
            KernelSpec(
                f"amax{rounds}_{FLOATS[k]}",
                "_amax_kernel",
                OP_AMAX,
                -1,
                k,
                sig,
                c,
                opts,
                roles,
                chunk=ce["BLOCK"] * rounds,
                module="onnxq.cast.triton_fast",
                hints=(*_ptrs(sig), "numel"),
            )
        )
    return specs


def _ptrs(signature: dict[str, str]) -> tuple[str, ...]:
    return tuple(n for n, t in signature.items() if t.startswith("*"))


def _pack_specs() -> list[KernelSpec]:
    """Device bit packing (onnxq.cast.triton_pack) for every width under 8 bits.

    The presets' codes and shift bits, and the codebooks' indices (2..7 bits) and meta (1..4).
    """
    from onnxq.cast import triton_pack

    widths = PACK_WIDTHS
    sig = {"src_ptr": "*u8", "dst_ptr": "*u8", "count": "i32", "nbytes": "i32"}
    roles = [
        ("src_ptr", "src", -1),
        ("dst_ptr", "dst", -1),
        ("count", "count", -1),
        ("nbytes", "nbytes", -1),
    ]
    specs = []
    for bits in sorted(widths):
        for op, name in ((OP_PACK, "_pack_kernel"), (OP_UNPACK, "_unpack_kernel")):
            ce = {"BITS": bits, "BLOCK": triton_pack.BLOCK}
            spec = KernelSpec(
                f"{name[1:-7]}{bits}",
                name,
                op,
                -1,
                bits,
                {**sig, "BITS": "constexpr", "BLOCK": "constexpr"},
                ce,
                dict(_OPTION_DEFAULTS),
                roles,
                chunk=triton_pack.BLOCK,
                module="onnxq.cast.triton_pack",
            )
            specs.append(spec)
    return specs


def _gather_spec() -> KernelSpec:
    """GatherMX's row copy (onnxq.cast.triton_gather): one byte-copy image for every stream."""
    from onnxq.cast import triton_gather

    sig = {"src_ptr": "*u8", "dst_ptr": "*u8", "rows_ptr": "*i32", "count": "i32",
           "row_bits": "i32", "BLOCK": "constexpr"}  # fmt: skip
    roles = [("src_ptr", "src", -1), ("dst_ptr", "dst", -1), ("rows_ptr", "rows", -1),
             ("count", "count", -1), ("row_bits", "row_bits", -1)]  # fmt: skip
    return KernelSpec(
        "gather_rows",
        "_gather_rows_kernel",
        OP_GATHER_ROWS,
        -1,
        0,
        sig,
        {"BLOCK": triton_gather.BLOCK},
        dict(_OPTION_DEFAULTS),
        roles,
        chunk=triton_gather.BLOCK,
        module="onnxq.cast.triton_gather",
    )


def _set_bt(ce: dict[str, Any]) -> None:
    if "BT" in ce:
        per_unit = ce.get("NSUB", 1) * ce.get("SUB", ce.get("TILE", 1))
        ce["BT"] = max(1, ELEMS_PER_PROGRAM // per_unit)


# -- codebook decoding (CodebookLookup) ----------------------------------------------------------
def _record_cb_dequant(
    tcb: Any, dt: Any, shape: tuple[int, ...], out_type: str, axis: int
) -> list[Launch]:
    import torch

    from onnxq.cast.layout import Tiling

    g = tcb._geom_of(Tiling.build(shape, axis % len(shape), dt.sspec))
    codes = torch.zeros(shape, dtype=torch.uint8)
    scale = torch.zeros(g.grid_shape, dtype=torch.uint8)
    meta = torch.zeros(g.meta_shape, dtype=torch.uint8)
    with recording(tcb) as launches, default_packing():
        tcb.dequantize(
            dt, shape, axis, codes, scale=scale, meta=meta, out_dtype=getattr(torch, out_type)
        )
    return launches


def _cb_specs(consts: list[bytes]) -> list[KernelSpec]:
    """`_cb_dequant_kernel` for every block of `CB_BLOCKS` and output type.

    Each block is recorded on a codebook whose tiles fit it exactly; every run-time argument
    (geometry and the format's numbers) must be one the launcher computes (`cb_geometry`), so
    one image serves every codebook data type whose tiles the block holds.
    """
    from onnxq.cast import triton_codebook as tcb

    specs = []
    for op, nsub_b, sub_b in CB_BLOCKS:
        tile = 2 * CB_MAX_TILE if op == OP_CB_LONG else nsub_b * sub_b
        sub = sub_b if op == OP_CB_SUB else 0
        dt = datatype(f"cb41fi_e2m2fnuz_e8m0_t{tile}" + (f"s{sub}" if sub else ""))
        last = ((3, 2 * tile), (2, 2, tile + 3 * max(sub, 1)))
        inner = ((3, 2 * tile, 2), (2, tile + 3 * max(sub, 1), 3))  # along axis 1
        for (k, ftype), (axis, shapes) in itertools.product(
            enumerate(FLOATS), ((-1, last), (1, inner))
        ):
            d = []
            for shape in shapes:
                rec = _record_cb_dequant(tcb, dt, shape, ftype, axis)
                if [la.kernel.fn.__name__ for la in rec] != ["_cb_dequant_kernel"]:
                    raise GenerationError(f"{dt.code}: expected one _cb_dequant_kernel launch")
                book, sc = dt.nspec, dt.sspec.scale
                geo = cb_geometry(
                    shape, tile, sub, sc.bits, sc.bias, book.index_bits, book.meta_bits, axis
                )
                d.append(_describe(rec[0], geo, consts, tenscale=False))
            _same(d[0], d[1], f"{dt.code} decoding")
            sig, ce, opts, roles = d[0]
            if any(r == "value" for _, r, _ in roles):
                raise GenerationError(f"{dt.code}: decoding has recorded scalars {roles}")
            want = dict(OUT_KIND=k, LAST=axis == -1, TENSOR=False, SUBT=bool(sub), NSUB=nsub_b)
            want.update(SUB=sub_b, CHUNKED=op == OP_CB_LONG)
            if any(ce.get(key) != v for key, v in want.items()):
                raise GenerationError(f"{dt.code}: decoding constexprs {ce}, expected {want}")
            if op == OP_CB_LONG:
                if ce["BT"] != 1:
                    raise GenerationError(f"{dt.code}: a chunked decode with BT {ce['BT']}")
            else:
                _set_bt(ce)
            kop = op if axis == -1 else CB_INNER_OPS[op]
            specs.append(
                KernelSpec(
                    f"cb{kop}_{nsub_b}x{sub_b}_{ftype}",
                    "_cb_dequant_kernel",
                    kop,
                    -1,
                    k,
                    sig,
                    ce,
                    opts,
                    roles,
                    module="onnxq.cast.triton_codebook_kernels",
                )
            )
    return specs
