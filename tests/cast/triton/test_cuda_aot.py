"""The C library's CUDA path: Triton kernels compiled ahead of time (docs/gpu.md).

On any machine: the ahead-of-time generation covers every specialisation for sm_80 and sm_90
(when triton imports), the library loads and says why CUDA is unavailable, and the launch API
refuses clearly without a driver. On a GPU (torch.cuda): every embedded specialisation, through
the C ABI on torch CUDA tensors, equals the numpy reference bit for bit.

GPU run: ``python -m pytest -q tests/cast/triton/test_cuda_aot.py`` after ``pip install -e .``
built the library with triton importable (the kernels are compiled then, not by the tests).
Quantize runs through the fast kernel (onnxq/cast/triton_fast.py) where the last axis is a
multiple of the tile and through the general kernels elsewhere; the GPU tests check both
(ONNXQ_CUDA_FAST=0 forces the general ones).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import onnxq

_ = onnxq.cast  # resolve the lazy attribute before importing the subpackage (see test_native)
from onnxq.cast import aot_spec, native  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
HAVE_TRITON = all(importlib.util.find_spec(m) is not None for m in ("torch", "triton"))
pytestmark = pytest.mark.needs_native


def _lib() -> ctypes.CDLL:
    from onnxq.cast import cuda_aot

    return cuda_aot._lib()


def _info() -> tuple[int, str]:
    from onnxq.cast import cuda_aot

    return cuda_aot.info()


# -- generation (CPU) ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def manifest(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, bytes]:
    """The build's aot output when it is current, else a fresh generation (slow: minutes)."""
    if not HAVE_TRITON:
        pytest.skip("torch/triton not installed: the library is built without GPU kernels")
    from onnxq.cast import aot

    out = ROOT / "ops" / "build" / "aot"
    mf = out / "manifest.json"
    current = mf.is_file() and json.loads(mf.read_text()).get("stamp") == aot._stamp(aot.PRESETS)
    if not current:
        out = tmp_path_factory.mktemp("aot")
        proc = _python(f"from onnxq.cast import aot; aot.generate({str(out)!r})")
        assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "manifest.json").read_text()), (out / "kernels.bin").read_bytes()


def test_generation_covers_every_specialisation(manifest: tuple[dict, bytes]) -> None:
    from onnxq.cast import aot

    m, blob = manifest
    assert m["archs"] == ["sm_80", "sm_90"] and m["ptx_arch"] == "sm_80"
    want = {
        (p, op, t)
        for p in aot.PRESETS
        for t in aot.FLOATS
        for op in (aot.OP_QUANT_VALUES, aot.OP_QUANT_CODES, aot.OP_QUANT_BOTH, aot.OP_DEQUANT)
    }
    have = {(k["format"], k["op"], k["io_type"]) for k in m["kernels"] if k["format"]}
    assert want <= have
    stats = {k["io_type"] for k in m["kernels"] if k["op"] == aot.OP_STATS}
    assert stats == set(aot.FLOATS)  # NVFP4's tensor amax, every input type
    # the fast path: values, codes and (where the layouts differ) packed codes, values and
    # codes along a non-last axis (INNER), every preset and input type; the tensor amax in
    # every compiled ROUNDS variant
    fmts = {f["preset"]: f for f in m["formats"]}
    both = (
        aot.OP_FAST_VALUES,
        aot.OP_FAST_CODES,
        aot.OP_FAST_VALUES_INNER,
        aot.OP_FAST_CODES_INNER,
    )
    fast = {
        (p, op, t)
        for p in aot.PRESETS
        for t in aot.FLOATS
        for op in both
        + ((aot.OP_FAST_PACKED,) if fmts[p]["code_bits"] < 8 or fmts[p]["sub"] else ())
    }
    assert fast <= have
    amax = {
        (k["io_type"], k["constexprs"]["ROUNDS"]) for k in m["kernels"] if k["op"] == aot.OP_AMAX
    }
    assert amax == {(t, r) for t in aot.FLOATS for r in aot.AMAX_ROUNDS}
    for k in m["kernels"]:
        if k["kernel"] == "_fast_kernel":  # the host's tuned program: 4096 elements, 8 warps
            ce = k["constexprs"]
            assert ce["HW_BF16"] is True and ce["BT"] * ce["TC"] == 4096, k["symbol"]
            assert k["num_warps"] == 8, k["symbol"]
        if k["op"] in (aot.OP_FAST_VALUES, aot.OP_FAST_CODES, aot.OP_FAST_PACKED, aot.OP_AMAX):
            # compiled for aligned buffers, as the JIT does (vector loads; the launcher checks)
            ptrs = [n for n, t in k["signature"].items() if t.startswith("*")]
            extra = ["numel"] if k["op"] == aot.OP_AMAX else []
            assert k["hints"] == ptrs + extra, k["symbol"]
    # codebook decoding (CodebookLookup): every block for every output type, format-general
    # (every run-time argument computed by the launcher, none recorded)
    # (and each block for the last axis and, LAST=False, for an axis with elements after it)
    cb = {
        (k["op"], k["constexprs"]["NSUB"], k["constexprs"]["SUB"], k["io_type"])
        for k in m["kernels"]
        if k["kernel"] == "_cb_dequant_kernel"
    }
    want = {(op, n, s, t) for op, n, s in aot.CB_BLOCKS for t in aot.FLOATS}
    want |= {(aot.CB_INNER_OPS[op], n, s, t) for op, n, s, t in want}
    assert cb == want
    for k in m["kernels"]:
        if k["kernel"] == "_cb_dequant_kernel":
            assert k["constexprs"]["LAST"] == (k["op"] in aot.CB_OPS), k["symbol"]
    for k in m["kernels"]:
        if k["kernel"] == "_cb_dequant_kernel":
            assert k["format"] is None and all(r != "value" for _, r, _ in k["roles"])
    packing = {
        (k["op"], k["io_type"]) for k in m["kernels"] if k["op"] in (aot.OP_PACK, aot.OP_UNPACK)
    }
    assert packing == {(op, w) for op in (aot.OP_PACK, aot.OP_UNPACK) for w in aot.PACK_WIDTHS}
    for k in m["kernels"]:
        for arch in ("sm_80", "sm_90"):
            off, size = k["cubin"][arch]
            assert size > 1000 and blob[off : off + 4] == b"\x7fELF", (k["symbol"], arch)
        off, size = k["ptx"]["sm_80"]
        ptx = blob[off : off + size]
        assert b".target sm_80" in ptx and ptx.endswith(b"\0"), k["symbol"]
        assert k["options"]["enable_fp_fusion"] is False
        # the compiled defaults: round even (rmode 0), no stochastic, no statistics pass
        assert k["constexprs"].get("STOCH", False) is False
        assert k["constexprs"].get("PRE", False) is False


def test_generation_records_the_modes_the_general_kernels_take(
    manifest: tuple[dict, bytes],
) -> None:
    m, _ = manifest
    fmts = {f["preset"]: f["modes"] for f in m["formats"]}
    # bump_t: the tile absmax's 24-bit significand (2^23 = 1.0) above which the scale goes one
    # binade up, by scale mode (floor, ceil, midmax, option3, topbinade, rceil, even). Worked
    # by hand from the scale modes' definitions (docs/architecture.md, decision 3):
    # - floor: never (2^24); ceil: anything above a power of two (2^23)
    # - mxfp8e4 (E4M3, max 448 = 1.75 * 2^8, next step 32): midmax 464 = 1.8125 * 2^8 ->
    #   1.8125 * 2^23 = 15204352; topbinade / rceil 1.75 * 2^23 = 14680064; option3 / even
    #   (rounded half-even to 4 significant bits: 1.1111b rounds up to 2) 1.9375 * 2^23 - 1
    #   = 16252927
    # - mxfp4 (E2M1, max 6 = 1.5 * 2^2, next step 2): midmax 7 = 1.75 * 2^2 -> 14680064;
    #   topbinade 1.5 * 2^23 = 12582912; option3 (2 significant bits: 1.11b rounds up)
    #   1.75 * 2^23 - 1 = 14680063
    # - integer elements (mxint8) take the floor exponent in every mode; NVFP4's float scale
    #   has no threshold (0, unused)
    never, ceil = 1 << 24, 1 << 23
    assert fmts["mxfp8e4"]["bump_t"] == [never, ceil, 15204352, 16252927, 14680064, 14680064,
                                          16252927]  # fmt: skip
    assert fmts["mxfp4"]["bump_t"] == [never, ceil, 14680064, 14680063, 12582912, 12582912,
                                        14680063]  # fmt: skip
    assert fmts["mxint8"]["bump_t"] == [never] * 7
    assert fmts["nvfp4"]["bump_t"] == [0] * 7
    for preset, modes in fmts.items():
        assert modes["rmode"] == [0, 1, 2] and modes["nan_nf"] == [0, 1], preset
        # the full range (-128 for int8) is an integer element's only
        ints = not onnxq.datatype(preset).nspec.is_float
        assert modes["full_int"] == ([0, 1] if ints else [0, 0]), preset
    # the general quantize kernels take them from the launcher, never as recorded values
    for k in m["kernels"]:
        if k["kernel"] == "_quant_kernel":
            roles = {name: role for name, role, _ in k["roles"]}
            for param in ("rmode", "nan_nf", "full_int", "bump_t"):
                assert roles[param] == param, (k["symbol"], param)


def test_the_mode_tables_are_in_the_c_abis_numbering() -> None:
    # AotFormat's tables are indexed by onnxq_modes' numbers: aot_spec.MODES lists the modes
    # in that order, which native.c_modes (the C ABI's) must give back
    for i, name in enumerate(aot_spec.MODES["round_mode"]):
        assert native.c_modes(name, "floor", "element", False).round_mode == i
    for i, name in enumerate(aot_spec.MODES["scale_mode"]):
        assert native.c_modes("even", name, "element", False).scale_mode == i
    for i, name in enumerate(aot_spec.MODES["nan_policy"]):
        assert native.c_modes("even", "floor", name, False).nan_policy == i
    assert aot_spec.MODES["full_int_range"] == (False, True)


def test_generation_refuses_a_mode_that_changes_another_parameter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not HAVE_TRITON:
        pytest.skip("torch/triton not installed")
    from onnxq.cast import aot_launches, aot_spec
    from onnxq.cast import triton as tm
    from onnxq.formats.datatype import datatype

    real = tm._quant_numbers

    def leaky(p, dtype, round_mode, scale_mode, nan_policy, full_int_range):  # type: ignore[no-untyped-def]
        nums = real(p, dtype, round_mode, scale_mode, nan_policy, full_int_range)
        if nan_policy.value == "block":
            nums["keep_inf"] = 1  # as if the policy changed a parameter the launcher records
        return nums

    monkeypatch.setattr(tm, "_quant_numbers", leaky)
    with pytest.raises(aot_spec.GenerationError, match="nan_policy 1 changes"):
        aot_launches.mode_table(tm, datatype("mxfp8e4"), "mxfp8e4", (512, 96))


def _python(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a script in a fresh interpreter: importing triton here would make the interpreter
    tests of tests/cast/triton/ skip (they need TRITON_INTERPRET=1 before triton is imported), and
    their support module sets TRITON_INTERPRET=1 here, which compiling must not see."""
    base = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=dict(base, **env),
        cwd=ROOT,
        timeout=600,
    )


@pytest.mark.parametrize(
    ("kernel", "param"), [("_quant_kernel", "top_ptr"), ("_fast_kernel", "ts_code_ptr")]
)
def test_generation_refuses_unknown_parameters(kernel: str, param: str) -> None:
    if not HAVE_TRITON:
        pytest.skip("torch/triton not installed")
    proc = _python(
        f"""
        from onnxq.cast import aot
        del aot._ROLES[{kernel!r}][{param!r}]
        try:
            aot.specialisations(("mxfp4",))
        except aot.GenerationError as err:
            print("refused:", err)
        """
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused:" in proc.stdout and param in proc.stdout and kernel in proc.stdout


def test_generation_ignores_the_packing_knob() -> None:
    # The embedded kernels use the default packing layout, whatever the build's environment
    # says: ONNXQ_TRITON_PACK_GROUP is an experiment's switch, not a build option.
    if not HAVE_TRITON:
        pytest.skip("torch/triton not installed")
    code = """
        from onnxq.cast import aot
        specs = aot.specialisations(("mxfp6e2",))[1]
        print(sorted({s.constexprs.get("P_GROUP") for s in specs} - {None}))
        """
    plain = _python(code)
    knob = _python(code, ONNXQ_TRITON_PACK_GROUP="16")
    assert plain.returncode == 0 and knob.returncode == 0, (plain.stderr + knob.stderr)[-2000:]
    assert plain.stdout.strip() == knob.stdout.strip() == "[4]", (plain.stdout, knob.stdout)


# The C++ launcher (ops/src/cuda_launch.cc) mirrored in Python over the generated table, run in
# Triton's interpreter: the geometry, the parameter roles and values, the chosen BT and NVFP4's
# tensor-amax passes give the reference's bits. (The cubins themselves need a GPU: see below.)
_EMULATE = """
import json, math, struct, sys
import numpy as np, torch
import onnxq
_ = onnxq.cast
from onnxq.cast import aot, triton as tm

formats, kernels, consts = aot.specialisations()
AMAX_PROGRAMS = aot._amax_programs()
TORCH = {"i32": torch.int32, "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8,
         "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

def find(fi, op, io):
    return next(k for k in kernels if k.fmt == fi and k.op == op and k.io_type == io)

FAST = (aot.OP_FAST_VALUES, aot.OP_FAST_CODES, aot.OP_FAST_PACKED)
WRITES_NO_CODES = (aot.OP_QUANT_VALUES, aot.OP_FAST_VALUES)
WRITES_NO_VALUES = (aot.OP_QUANT_CODES, aot.OP_FAST_CODES, aot.OP_FAST_PACKED)

def launch(k, ptrs, geo):
    kw = dict(k.constexprs)
    if "HW_BF16" in kw:
        assert kw["HW_BF16"] is True  # the images convert in hardware;
        kw["HW_BF16"] = False  # the interpreter's conversion needs the bit arithmetic
    for name, role, extra in k.roles:
        sig = k.signature[name]
        if sig.startswith("*"):
            if role == "const":
                t = torch.frombuffer(bytearray(consts[extra]), dtype=torch.uint8)
                kw[name] = t.view(TORCH[sig[1:]])
            elif ptrs.get(role) is None:
                kw[name] = torch.zeros(1, dtype=TORCH[sig[1:]])  # null: never touched
            elif ptrs[role].dtype != TORCH[sig[1:]] and (
                    k.op in WRITES_NO_CODES and role in ("codes", "scale", "meta")
                    or k.op in WRITES_NO_VALUES and role == "y"):
                kw[name] = torch.zeros(1, dtype=TORCH[sig[1:]])  # the output it does not write
            else:
                kw[name] = ptrs[role].view(TORCH[sig[1:]])
        elif role == "value":
            kw[name] = struct.unpack("<f", struct.pack("<i", extra))[0] if sig == "fp32" else extra
        else:
            kw[name] = geo[role]
    bt = max(k.constexprs.get("BT", 1), 1)
    grid = -(-geo["n_units"] // bt) if "n_units" in geo else 0
    if k.op in FAST:
        grid = -(-geo["n_tiles"] // bt)
    elif k.op == aot.OP_AMAX:
        grid = -(-geo["numel"] // k.chunk)
    getattr(__import__(k.module, fromlist=["x"]), k.kernel)[(grid,)](**kw)

def fast_geo(f, shape, packed):  # the launcher's Bind for the fast kernels
    numel = math.prod(shape)
    nmeta = numel // f.sub if f.sub else 0
    return dict(n_tiles=numel // f.tile, numel=numel, inner=1,
                code_nbytes=(numel * f.code_bits + 7) // 8 if packed else numel,
                meta_nbytes=(nmeta + 7) // 8 if packed else nmeta)

def amax_kernel(io, numel):  # the launcher's choice of ROUNDS
    best = smallest = None
    for k in kernels:
        if k.op != aot.OP_AMAX or k.io_type != io:
            continue
        block = k.chunk // k.constexprs["ROUNDS"]
        need = -(-(-(-numel // block)) // AMAX_PROGRAMS)
        rounds = 1
        while rounds < need:
            rounds <<= 1
        r = k.constexprs["ROUNDS"]
        if smallest is None or r < smallest.constexprs["ROUNDS"]:
            smallest = k
        if r <= rounds and (best is None or r > best.constexprs["ROUNDS"]):
            best = k
    return best or smallest

def fast_amax(xi, io, numel, k=None):
    top = torch.zeros(1, dtype=torch.int32)
    launch(k or amax_kernel(io, numel), {"x": xi, "top": top}, {"numel": numel})
    return top

def quantize(fi, x, io):
    f = formats[fi]
    if x.shape[-1] % f.tile == 0:
        return quantize_fast(fi, x, io)
    geo = f.geometry(tuple(x.shape)) | f.mode_numbers()  # the default modes
    xi = x.view(torch.int32) if x.dtype == torch.float32 else x.view(torch.int16)
    vals = torch.empty_like(x)
    codes = torch.empty(x.shape, dtype=torch.uint8)
    scale = torch.empty(geo["n_units"], dtype=torch.uint8)
    meta = torch.empty(max(1, x.numel() // x.shape[-1] * geo["sub_cols"]), dtype=torch.uint8)
    ts = torch.zeros(1, dtype=torch.int32)
    ptrs = {"x": xi, "y": vals.view(xi.dtype), "codes": codes, "scale": scale,
            "meta": meta if f.sub else None, "ts_code": ts}
    if f.tenscale_bits:
        src, n, first = xi, x.numel(), True
        while True:
            k = find(-1, aot.OP_STATS, io if first else 0)
            c = -(-n // k.chunk)
            amax, flags = torch.empty(c, dtype=torch.int32), torch.empty(c, dtype=torch.int8)
            launch(k, {"x": src, "amax_out": amax, "flag_out": flags},
                   dict(n_units=c, n_chunks=c, C=n, TC=n, inner=1, nC=1))
            src, n, first = amax, c, False
            if c == 1:
                break
        ptrs["top"] = src
    launch(find(fi, aot.OP_QUANT_BOTH, io), ptrs, geo)
    alone = quantize_apart(fi, x, io, dict(ptrs))
    return vals, codes, scale, meta, ts, alone

def quantize_fast(fi, x, io):
    # values, then codes: two launches of the fast kernel (after the amax pass for NVFP4)
    f = formats[fi]
    xi = x.view(torch.int32) if x.dtype == torch.float32 else x.view(torch.int16)
    vals = torch.empty_like(x)
    codes = torch.empty(x.shape, dtype=torch.uint8)
    scale = torch.empty(x.numel() // f.tile, dtype=torch.uint8)
    meta = torch.empty(max(1, x.numel() // max(f.sub, 1)), dtype=torch.uint8)
    ts = torch.zeros(1, dtype=torch.int32)
    ptrs = {"x": xi, "y": vals.view(xi.dtype), "codes": codes, "scale": scale,
            "meta": meta if f.sub else None, "ts_code": ts}
    if f.tenscale_bits:
        ptrs["top"] = fast_amax(xi, io, x.numel())
    geo = fast_geo(f, tuple(x.shape), False)
    launch(find(fi, aot.OP_FAST_VALUES, io), ptrs, geo)
    launch(find(fi, aot.OP_FAST_CODES, io), ptrs, geo)
    return vals, codes, scale, meta, ts, None

def quantize_packed_fast(fi, x, io):
    f = formats[fi]
    geo = fast_geo(f, tuple(x.shape), True)
    xi = x.view(torch.int32) if x.dtype == torch.float32 else x.view(torch.int16)
    q = torch.empty(geo["code_nbytes"], dtype=torch.uint8)
    scale = torch.empty(geo["n_tiles"], dtype=torch.uint8)
    meta = torch.empty(max(1, geo["meta_nbytes"]), dtype=torch.uint8)
    ts = torch.zeros(1, dtype=torch.int32)
    ptrs = {"x": xi, "codes": q, "scale": scale, "meta": meta if f.sub else None,
            "ts_code": ts}
    if f.tenscale_bits:
        ptrs["top"] = fast_amax(xi, io, x.numel())
    same = f.code_bits == 8 and not f.sub  # the launcher takes the unpacked codes' kernel
    launch(find(fi, aot.OP_FAST_CODES if same else aot.OP_FAST_PACKED, io), ptrs, geo)
    return q, scale, meta[: geo["meta_nbytes"]], ts

def quantize_apart(fi, x, io, ptrs):
    # the values-only and codes-only kernels, into fresh buffers
    f = formats[fi]
    ptrs["y"] = torch.empty_like(ptrs["y"])
    for key in ("codes", "scale") + (("meta",) if f.sub else ()):
        ptrs[key] = torch.empty_like(ptrs[key])
    geo = f.geometry(tuple(x.shape)) | f.mode_numbers()
    launch(find(fi, aot.OP_QUANT_VALUES, io), ptrs, geo)
    launch(find(fi, aot.OP_QUANT_CODES, io), ptrs, geo)
    return ptrs

def bits(a):
    a = np.ascontiguousarray(a)
    return a.view({4: np.int32, 2: np.int16, 1: np.uint8}[a.dtype.itemsize])

bad = []
rng = np.random.default_rng(0)
for fi, f in enumerate(formats):
    # the fast kernel where the last axis is a multiple of the tile, else the general ones
    shapes = [(3, 36), (2, 3, 48), (4, 64)] + ([(5000,), (5008,)] if f.tenscale_bits else [])
    for shape in shapes:
        x = (rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, shape))).astype(np.float32)
        x.reshape(-1)[::7] = np.array([0.0, -0.0, np.inf, np.nan, 1e-40, -3e38, 6.0])[
            np.arange(x.reshape(-1)[::7].size) % 7]
        if len(shape) == 1:  # the tensor amax in the second chunk, NaN/Inf elsewhere
            x = rng.standard_normal(shape).astype(np.float32)
            x[[3, 70]] = np.inf, np.nan
            x[-3] = -100.0
        vals, codes, scale, meta, ts, alone = quantize(fi, torch.from_numpy(x), 0)
        want = onnxq.cast(x, f.preset, backend="reference")
        q = onnxq.cast(x, f.preset, mode="actual", backend="reference")
        ok = np.array_equal(bits(vals.numpy()), bits(want))
        ok &= np.array_equal(codes.numpy(), q.data.astype(np.uint8))
        ok &= np.array_equal(scale.numpy(), q.scale.reshape(-1))
        if q.meta is not None:
            ok &= np.array_equal(meta.numpy()[: q.meta.size], q.meta.reshape(-1))
        if q.tenscale is not None:
            ok &= int(ts[0]) & 0xFFFFFFFF == int(q.tenscale[0])
        if alone is not None:
            ok &= np.array_equal(alone["y"].view(torch.float32).numpy().view(np.int32),
                                 bits(want))
            ok &= np.array_equal(alone["codes"].numpy(), codes.numpy())
            ok &= np.array_equal(alone["scale"].numpy(), scale.numpy())
            if f.sub:
                ok &= np.array_equal(alone["meta"].numpy(), meta.numpy())
        if shape[-1] % f.tile == 0:  # the packed layouts in one launch
            for io, t in ((0, torch.float32), (2, torch.bfloat16)):
                xt = torch.from_numpy(x).to(t)
                qp, sp, mp, tsp = quantize_packed_fast(fi, xt, io)
                xr = xt.float().numpy() if io else x
                c = onnxq.cast(xr, f.preset, mode="compress", backend="reference")
                ok &= np.array_equal(qp.numpy(), c.data)
                ok &= np.array_equal(sp.numpy(), c.scale.reshape(-1))
                if c.meta is not None:
                    ok &= np.array_equal(mp.numpy(), c.meta.reshape(-1))
                if c.tenscale is not None:
                    ok &= int(tsp[0]) & 0xFFFFFFFF == int(c.tenscale[0])
        # dequantize the reference's codes
        y = torch.empty(shape, dtype=torch.float32)
        k = find(fi, aot.OP_DEQUANT, 0)
        tsv = None
        if q.tenscale is not None:
            tsv = torch.from_numpy(q.tenscale.view(np.float32).copy())
        launch(k, {"codes": torch.from_numpy(q.data.astype(np.uint8)), "y": y.view(torch.int32),
                   "scale": torch.from_numpy(q.scale.reshape(-1).copy()),
                   "meta": None if q.meta is None else torch.from_numpy(q.meta.reshape(-1).copy()),
                   "ts": tsv}, f.geometry(shape))
        ok &= np.array_equal(bits(y.numpy()), bits(want))
        if not ok:
            bad.append(f"{f.preset} {shape}")
# every tensor-amax variant (the launcher picks by size) gives the same amax
x = rng.standard_normal(70000).astype(np.float32)
x[[5, 69000]] = np.inf, 300.0
for k in kernels:
    if k.op == aot.OP_AMAX and k.io_type == 0:
        top = fast_amax(torch.from_numpy(x).view(torch.int32), 0, x.size, k)
        if int(top[0]) != int(np.float32(300.0).view(np.int32)):
            bad.append(k.symbol)
from onnxq.cast.packing import pack_bits
for k in kernels:
    if k.op not in (aot.OP_PACK, aot.OP_UNPACK):
        continue
    bits = k.io_type
    for count in (1, 9, 3001):
        c = rng.integers(0, 1 << bits, count).astype(np.uint8)
        nb = (count * bits + 7) // 8
        packed = pack_bits(c, bits)
        out = torch.zeros(nb if k.op == aot.OP_PACK else count, dtype=torch.uint8)
        src = torch.from_numpy(c if k.op == aot.OP_PACK else packed.copy())
        units = nb if k.op == aot.OP_PACK else count
        kw = {**k.constexprs, "src_ptr": src, "dst_ptr": out, "count": count, "nbytes": nb}
        getattr(__import__(k.module, fromlist=["x"]), k.kernel)[(-(-units // k.chunk),)](**kw)
        if not np.array_equal(out.numpy(), packed if k.op == aot.OP_PACK else c):
            bad.append(f"{k.symbol} {count}")
print(json.dumps(bad))
"""


def test_launcher_logic_in_the_interpreter() -> None:
    if not HAVE_TRITON:
        pytest.skip("torch/triton not installed")
    proc = _python(_EMULATE, TRITON_INTERPRET="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_library_embeds_the_kernels_when_triton_imports() -> None:
    n, text = _info()
    if not HAVE_TRITON or os.environ.get("ONNXQ_NO_GPU_KERNELS"):
        pytest.skip("the library is built without GPU kernels here")
    assert n > 0, f"triton imports but the library has no GPU kernels ({text}); rebuild it"
    from onnxq.cast import aot, cuda_aot

    assert cuda_aot.formats() == list(aot.PRESETS)


# -- no driver (CPU; on a GPU machine too, through ONNXQ_LIBCUDA) ------------------------------
_NO_DRIVER = textwrap.dedent(
    """
    import ctypes, json, sys
    import onnxq
    _ = onnxq.cast
    from onnxq.cast import cuda_aot
    lib = cuda_aot._lib()
    err = ctypes.create_string_buffer(512)
    out = {"available": lib.onnxq_cuda_available(err, 512), "why": err.value.decode()}
    shape = (ctypes.c_int64 * 2)(4, 64)
    calls = {
        "quantize": lambda: lib.onnxq_cuda_quantize(
            b"mxfp4", None, 4096, 0, 2, shape, -1, 8192, None, None, None, None, None, err, 512),
        "dequantize": lambda: lib.onnxq_cuda_dequantize(
            b"mxfp4", 2, shape, -1, 4096, 8192, None, None, 12288, 0, None, err, 512),
        "unknown": lambda: lib.onnxq_cuda_quantize(
            b"e9m9", None, 4096, 0, 2, shape, -1, 8192, None, None, None, None, None, err, 512),
        "axis": lambda: lib.onnxq_cuda_quantize(
            b"mxfp4", None, 4096, 0, 2, shape, 2, 8192, None, None, None, None, None, err, 512),
        "nothing": lambda: lib.onnxq_cuda_quantize(
            b"mxfp4", None, 4096, 0, 2, shape, -1, None, None, None, None, None, None, err, 512),
        "type": lambda: lib.onnxq_cuda_quantize(
            b"mxfp4", None, 4096, 7, 2, shape, -1, 8192, None, None, None, None, None, err, 512),
        "noscale": lambda: lib.onnxq_cuda_quantize(
            b"mxfp4", None, 4096, 0, 2, shape, -1, None, 8192, None, None, None, None, err, 512),
    }
    for name, call in calls.items():
        rc = call()
        out[name] = [rc, err.value.decode()]
    print(json.dumps(out))
    """
)


def _run_without_driver() -> dict:
    env = dict(os.environ, ONNXQ_LIBCUDA="/nonexistent/libcuda.so.1")
    proc = subprocess.run(
        [sys.executable, "-c", _NO_DRIVER],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_without_driver_the_calls_fail_clearly() -> None:
    out = _run_without_driver()
    n, _ = _info()
    assert out["available"] == 0
    if n == 0:
        assert "built without GPU kernels" in out["why"]
        for name in ("quantize", "dequantize", "unknown", "axis", "nothing", "noscale"):
            rc, msg = out[name]
            assert rc == 1 and msg.startswith("[onnxq_cuda_"), (name, msg)
        return
    assert "/nonexistent/libcuda.so.1 cannot be loaded" in out["why"]
    for name in ("quantize", "dequantize"):
        rc, msg = out[name]
        assert rc == 1 and "cannot be loaded (no NVIDIA driver" in msg, (name, msg)
    expected = {
        "unknown": "no CUDA kernel for data type 'e9m9'",
        "axis": "axis 2 is out of range for a rank-2 tensor",
        "nothing": "nothing to compute",
        "type": "float types are 0 (float32)",
        "noscale": "codes need the scale output",
    }
    for name, words in expected.items():
        rc, msg = out[name]
        assert rc == 1 and words in msg, (name, msg)


def test_python_wrapper_refuses_cpu_tensors_and_reports_availability() -> None:
    torch = pytest.importorskip("torch")
    from onnxq.cast import cuda_aot

    ok, why = cuda_aot.available()
    if not torch.cuda.is_available():
        assert not ok and why
    with pytest.raises(ValueError, match="CUDA tensors"):
        cuda_aot.quantize(torch.zeros(4, 32), "mxfp4")
    with pytest.raises(TypeError, match="torch tensor"):
        cuda_aot.quantize(np.zeros((4, 32), np.float32), "mxfp4")
    # codebook decoding: CPU tensors, a data type that is no codebook, a float output it does not
    # write, all refused before the library is called
    code = "cb41fi_e2m2fnuz_e8m0_t32"  # 4-bit indices, 1 meta bit per tile
    q, s, m = (torch.zeros(n, dtype=torch.uint8) for n in (64, 4, 1))
    with pytest.raises(ValueError, match="CUDA tensors"):
        cuda_aot.lookup_packed(code, (4, 32), q, s, m)
    with pytest.raises(TypeError, match="not a codebook"):
        cuda_aot.lookup_packed("mxfp4", (4, 32), q, s, m)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        cuda_aot.lookup_packed(code, (4, 32), q, s, m, out_dtype=torch.float64)


@pytest.mark.parametrize(
    ("modes", "needle"),
    [
        ((3, 0, 0, 0), "stochastic rounding has no CUDA kernel"),
        ((0, 7, 0, 0), "scale mode 'search' has no CUDA kernel"),
        ((0, 9, 0, 0), "unknown modes: round 0, scale 9, nan 0"),
        ((0, 0, 2, 0), "unknown modes: round 0, scale 0, nan 2"),
    ],
)
def test_modes_without_kernels_are_refused_before_the_driver(modes: tuple, needle: str) -> None:
    # (round, scale, nan policy, full int range): refused before any pointer is looked at
    lib = _lib()
    c_modes = native._Modes(*modes, 0)
    err = ctypes.create_string_buffer(512)
    shape = (ctypes.c_int64 * 1)(32)
    for fn in (lib.onnxq_cuda_quantize, lib.onnxq_cuda_quantize_packed):
        rest = (None,) * (5 if fn is lib.onnxq_cuda_quantize else 4)
        rc = fn(b"mxfp4", ctypes.byref(c_modes), 4096, 0, 1, shape, -1, 8192, *rest, err, 512)
        assert rc == 1 and needle in err.value.decode(), err.value.decode()


# (op type, dtype, modes) -> the reason the CUDA provider runs the node on the CPU ("" none)
NODE_SUPPORT = [
    (("QuantizeDequantizeMX", "mxfp8", {}), ""),
    (("QuantizeMX", "\n E4M3_E8M0_T32 ", {"round_mode": "away", "scale_mode": "midmax"}), ""),
    (("DequantizeMX", "int8_e8m0_t8", {}), ""),  # BFP16 --block-size 8
    (("CodebookLookup", "cb41_e2m2fnuz_e8m0_t32", {}), ""),  # generic: the Table at each Run
    (("QuantizeMX", "int8_e8m0_t64", {}), "dtype 'int8_e8m0_t64' has no CUDA kernel"),
    (("DequantizeMX", "int8_e8m0_t8_t4", {}), "dtype 'int8_e8m0_t8_t4' has no CUDA kernel"),
    (("QuantizeMX", "mx6", {"round_mode": "stochastic"}), "stochastic rounding has no CUDA"),
    (("QuantizeDequantizeMX", "mx6", {"scale_mode": "search"}), "scale mode 'search' has no"),
    (("DequantizeMX", "mx6", {"round_mode": "stochastic"}), ""),  # modes: quantize only
    (("CodebookLookup", "cb41fi_e2m2fnuz_e8m0_t4_t8", {}), "tiles along one axis only"),
    (("MatMulMX", "mxfp4", {}), "MatMulMX has no CUDA kernel: onnxruntime runs it on the CPU"),
    # GatherMX by its table: rows of whole tiles on the kernels (132-bit rows included)
    (("GatherMX", "mxfp4", {"shape": [10, 33]}), ""),
    (("GatherMX", "mx6", {"shape": [9, 2, 20], "axis": 2}), ""),
    (("GatherMX", "mxfp4", {"shape": [5, 64, 3], "axis": -2}), ""),
    (("GatherMX", "cb41_e2m2fnuz_e8m0_t32", {"shape": [6, 96]}), ""),
    (("GatherMX", "mxfp4", {"shape": [64, 6], "axis": 0}), "tiles run along the table's rows"),
    (("GatherMX", "mxfp4", {"shape": [64], "axis": 0}), "tiles run along the table's rows"),
    (("GatherMX", "int8_channel", {"shape": [6, 16]}), "dtype 'int8_channel' has no CUDA kernel"),
    (("GatherMX", "cb41fi_e2m2fnuz_e8m0_t4_t8", {"shape": [8, 8]}), "tiles along one axis only"),
]


@pytest.mark.parametrize(("node", "reason"), NODE_SUPPORT)
def test_node_support_says_where_the_cuda_provider_runs_a_node(node: tuple, reason: str) -> None:
    # no GPU needed: what `onnxq inspect` reports (test_cuda_emulated checks it against the
    # session's own decisions)
    from onnxq.cast import cuda_aot

    why = cuda_aot.node_support(node[0], node[1], **node[2])
    if _info()[0] == 0:  # no CUDA registrations: every node on the CPU provider
        assert "built without GPU kernels" in why, why
        return
    assert (why == "") if not reason else (reason in why), why
    assert "\n" not in why


@pytest.mark.parametrize(
    ("node", "error"),
    [
        (("Unknown", "mxfp4", {}), "unknown op type 'Unknown'"),
        (("QuantizeMX", "mxfp4\x01", {}), "unexpected character '\\x01'"),
        (("QuantizeMX", "", {}), "data type"),
        (("CodebookLookup", "mxfp4", {}), "dtype 'mxfp4': the data type is not a codebook"),
        (("QuantizeMX", "mxfp4", {"round_mode": "up"}), "round"),
        (("QuantizeMX", "mxfp4", {"int_range": "wide"}), "int_range 'wide'"),
        (("QuantizeMX", "mxfp4\0junk", {}), "a NUL byte"),  # C would read 'mxfp4'
        (("QuantizeMX\0", "mxfp4", {}), "a NUL byte"),
        (("QuantizeMX", "mxfp4\udcff", {}), "unexpected character '\\'"),
        (("QuantizeMX", "e" * 100_000, {}), "at most"),
        (("Q" * 100_000, "mxfp4", {}), "unknown op type 'QQQ"),
        # GatherMX: its table's shape and axis, as the op checks them (hostile attributes)
        (("GatherMX", "mxfp4", {}), "GatherMX needs its table's shape"),
        (("GatherMX", "mxfp4", {"shape": []}), "GatherMX needs its table's shape"),
        (("GatherMX", "mxfp4", {"shape": [0, 32]}), "must hold positive dims"),
        (("GatherMX", "mxfp4", {"shape": [2**21, 2**20]}), "at most 2^40 elements"),
        (("GatherMX", "mxfp4", {"shape": [2**70, 2]}), "out of range"),
        (("GatherMX", "mxfp4", {"shape": [4, 32], "axis": 2}), "axis 2 is out of range"),
        (("GatherMX", "mxfp4", {"shape": [4.0, 32]}), "must be integers"),
        (("GatherMX", "e2m1fnuz_e8m0_t32n2m4", {"shape": [4, 32]}), "N:M sparsity"),
    ],
)
def test_node_support_refuses_what_the_ops_refuse(node: tuple, error: str) -> None:
    from onnxq.cast import cuda_aot

    if _info()[0] == 0:
        pytest.skip("built without GPU kernels")
    with pytest.raises(ValueError, match=re.escape(error)):
        cuda_aot.node_support(node[0], node[1], **node[2])


# -- on a GPU ------------------------------------------------------------------------------------
def _gpu_ready() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    n, text = _info()
    if n == 0:
        return False, text
    return True, ""


gpu = pytest.mark.skipif(not _gpu_ready()[0], reason=f"GPU path not testable: {_gpu_ready()[1]}")

SPECIALS = np.array(
    [
        0.0,
        -0.0,
        np.inf,
        -np.inf,
        np.nan,
        1.0,
        -1.0,
        2.0**-126,
        2.0**-149,
        -(2.0**-140),
        2.0**127,
        3.4e38,
        6.0,
        5.99,
        448.0,
        0.5,
        1 - 2**-24,
        1e-30,
        65504.0,
        -7.0e4,
    ],
    dtype=np.float32,
)
SHAPES = [(7, 96), (3, 5, 40), (1, 33), (64, 128), (5, 1)]
# The launcher runs the fast kernel (onnxq/cast/triton_fast.py) where the last axis is a multiple
# of the tile (96 and 128 for every preset) and the general kernels elsewhere (40 for the 32-long
# tiles and the 16-long ones, 33, 1); ONNXQ_CUDA_FAST=0 sends everything to the general kernels.


def _fast(preset: str, shape: tuple[int, ...]) -> bool:
    return shape[-1] % onnxq.datatype(preset).sspec.tiles[0].size == 0


@pytest.fixture
def general_only(monkeypatch: pytest.MonkeyPatch):
    """A context that sends the launcher to the general kernels (the library reads the
    variable at each call)."""
    import contextlib

    @contextlib.contextmanager
    def ctx():
        with monkeypatch.context() as m:
            m.setenv("ONNXQ_CUDA_FAST", "0")
            yield

    return ctx


def _data(shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, shape))).astype(np.float32)
    flat = x.reshape(-1)
    where = rng.integers(0, flat.size, max(1, flat.size // 4))
    flat[where] = rng.choice(SPECIALS, where.size)
    if flat.size >= 64:
        flat[:32] = 0.0  # an all-zero tile
        flat[32:48] = np.nan if seed % 2 else -0.0
    return x


def _np_dtype(name: str):
    return {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[name]


def _to_torch(a: np.ndarray):
    import torch

    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).cuda()
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def _bits(t) -> np.ndarray:
    import torch

    t = t.detach().cpu().contiguous()
    if t.dtype in (torch.float32,):
        return t.view(torch.int32).numpy()
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.view(torch.int16).numpy()
    if t.dtype == torch.uint32:
        return t.view(torch.int32).numpy()
    return t.numpy()


def _ref_bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({4: np.int32, 2: np.int16, 1: np.uint8}[a.dtype.itemsize])


PRESETS = aot_spec.PRESETS  # every embedded preset
TYPES = ("float32", "float16", "bfloat16")


@gpu
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("ftype", TYPES)
def test_quantize_and_dequantize_equal_the_reference(preset: str, ftype: str, general_only) -> None:
    import torch

    from onnxq.cast import cuda_aot

    for i, shape in enumerate(SHAPES):
        x = _data(shape, i).astype(_np_dtype(ftype))
        ref_v = onnxq.cast(x, preset, backend="reference")
        q = onnxq.cast(x, preset, mode="actual", backend="reference")
        xt = _to_torch(x)
        got = cuda_aot.quantize(xt, preset)
        only_v = cuda_aot.quantize(xt, preset, want_codes=False)["values"]
        only_c = cuda_aot.quantize(xt, preset, want_values=False)
        path = "fast" if _fast(preset, shape) else "general"
        outs = {f"{path} both": got, f"{path} codes": only_c}
        values = {f"{path} both": got["values"], f"{path} values": only_v}
        if _fast(preset, shape):  # the same shape through the general kernels
            with general_only():
                gen = cuda_aot.quantize(xt, preset)
            outs["general both"] = gen
            values["general both"] = gen["values"]
        torch.cuda.synchronize()
        for label, v in values.items():
            where = f"{preset} {ftype} {shape} {label}"
            np.testing.assert_array_equal(_bits(v), _ref_bits(ref_v), err_msg=where)
        for label, out in outs.items():
            where = f"{preset} {ftype} {shape} {label}"
            np.testing.assert_array_equal(_bits(out["codes"]), q.data.astype(np.uint8), where)
            np.testing.assert_array_equal(_bits(out["scale"]), q.scale, err_msg=where)
            if q.meta is not None:
                np.testing.assert_array_equal(_bits(out["meta"]), q.meta, err_msg=where)
            else:
                assert "meta" not in out
            if q.tenscale is not None:
                np.testing.assert_array_equal(
                    _bits(out["tenscale"]), q.tenscale.view(np.int32), err_msg=where
                )
        # dequantize the reference's codes, into every float type
        for otype in TYPES:
            y = cuda_aot.dequantize(
                preset,
                _to_torch(q.data.astype(np.uint8)),
                _to_torch(q.scale),
                tenscale=None if q.tenscale is None else _to_torch(q.tenscale.astype(np.uint32)),
                meta=None if q.meta is None else _to_torch(q.meta),
                out_dtype=getattr(torch, otype),
            )
            want = onnxq.upcast(q, _np_dtype(otype))
            np.testing.assert_array_equal(_bits(y), _ref_bits(want), err_msg=f"{where} {otype}")


@gpu
def test_nvfp4_tensor_amax_over_several_passes(general_only) -> None:
    """Over 4096^2 elements the general path's tensor amax takes three reduction passes; the
    fast path's one pass strides 4 blocks a program over 2^25 elements."""
    import torch

    from onnxq.cast import cuda_aot

    for n, path in ((4096 * 4096 + 4096 * 3 + 48, "general"), ((1 << 25) + 4096 * 3 + 48, "fast")):
        x = torch.randn(n // 16, 16, device="cuda")
        x.view(-1)[n - 5] = 1000.0  # the amax, in the last chunk
        if path == "general":
            with general_only():
                got = cuda_aot.quantize(x, "nvfp4", want_values=False)
        else:
            got = cuda_aot.quantize(x, "nvfp4", want_values=False)
        torch.cuda.synchronize()
        want = onnxq.cast(x.cpu().numpy(), "nvfp4", mode="actual", backend="native")
        np.testing.assert_array_equal(_bits(got["tenscale"]), want.tenscale.view(np.int32), path)
        np.testing.assert_array_equal(_bits(got["scale"]), want.scale, path)
        np.testing.assert_array_equal(_bits(got["codes"]), want.data.astype(np.uint8), path)


@gpu
def test_nvfp4_fast_tensor_amax_of_a_large_tensor() -> None:
    """2^28 + 2^26 elements: 64 blocks a program (the largest compiled variant); the tensor
    scale depends on the amax alone, so a small tensor with the same amax gives the reference."""
    import torch

    from onnxq.cast import cuda_aot

    x = torch.zeros(((1 << 28) + (1 << 26)) // 16, 16, dtype=torch.bfloat16, device="cuda")
    x[-1, -1] = -1000.0
    x[0, 0] = 3.0
    got = cuda_aot.quantize(x, "nvfp4", want_values=False)
    small = np.zeros((2, 16), ml_dtypes.bfloat16)  # the first and the last row
    small[0, 0], small[1, -1] = 3.0, -1000.0
    want = onnxq.cast(small, "nvfp4", mode="actual", backend="reference")
    torch.cuda.synchronize()
    np.testing.assert_array_equal(_bits(got["tenscale"]), want.tenscale.view(np.int32))
    for row, wrow in ((0, 0), (-1, 1)):
        np.testing.assert_array_equal(_bits(got["scale"][row]), want.scale[wrow])
        np.testing.assert_array_equal(_bits(got["codes"][row]), want.data[wrow].astype(np.uint8))


@gpu
def test_gpu_refuses_host_memory_and_wrong_dtypes() -> None:
    import torch

    from onnxq.cast import cuda_aot

    lib = _lib()
    err = ctypes.create_string_buffer(512)
    host = np.zeros((4, 32), np.float32)
    out = torch.empty(4, 32, device="cuda")
    shape = (ctypes.c_int64 * 2)(4, 32)
    rc = lib.onnxq_cuda_quantize(
        b"mxfp4",
        None,
        host.ctypes.data,
        0,
        2,
        shape,
        -1,
        out.data_ptr(),
        None,
        None,
        None,
        None,
        None,
        err,
        512,
    )
    assert rc == 1 and "x is not CUDA device memory" in err.value.decode()
    rc = lib.onnxq_cuda_quantize(
        b"mxfp4",
        None,
        out.data_ptr(),
        0,
        2,
        shape,
        -1,
        host.ctypes.data,
        None,
        None,
        None,
        None,
        None,
        err,
        512,
    )
    assert rc == 1 and "values is not CUDA device memory" in err.value.decode()
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        cuda_aot.quantize(torch.zeros(4, 32, dtype=torch.int32, device="cuda"), "mxfp4")
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        cuda_aot.quantize(torch.zeros(4, 32, dtype=torch.float64, device="cuda"), "mxfp4")
    with pytest.raises(RuntimeError, match="no CUDA kernel for data type"):
        cuda_aot.quantize(torch.zeros(4, 32, device="cuda"), "int8_e8m0_t64")  # not embedded
    codes = torch.zeros(4, 32, dtype=torch.uint8, device="cuda")
    with pytest.raises(TypeError, match="scale must be uint8"):
        cuda_aot.dequantize("mxfp4", codes, torch.zeros(4, 1, dtype=torch.float32, device="cuda"))
    ok, why = cuda_aot.available()
    assert ok and why == ""


@gpu
def test_runs_on_a_side_stream() -> None:
    import torch

    from onnxq.cast import cuda_aot

    x = torch.randn(256, 64, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = cuda_aot.quantize(x, "mxfp8e4")["values"]
    s.synchronize()
    want = onnxq.cast(x.cpu().numpy(), "mxfp8e4", backend="reference")
    np.testing.assert_array_equal(_bits(got), _ref_bits(want))


@gpu
@pytest.mark.parametrize("preset", PRESETS)
def test_packed_layouts_equal_compress_mode(preset: str, general_only) -> None:
    """The custom ops' layouts (what the CUDA execution provider's ops write and read): one
    launch of the fast kernel, or the general kernels and the pack kernels."""
    import torch

    from onnxq.cast import cuda_aot

    for i, shape in enumerate([(7, 96), (3, 5, 40), (2, 33), (4, 4096)]):
        for ftype in TYPES:
            x = _data(shape, i).astype(_np_dtype(ftype))
            q = onnxq.cast(x, preset, mode="compress", backend="reference")
            outs = [cuda_aot.quantize_packed(_to_torch(x), preset)]
            if _fast(preset, shape):
                with general_only():
                    outs.append(cuda_aot.quantize_packed(_to_torch(x), preset))
            torch.cuda.synchronize()
            for path, got in zip(("default", "general"), outs, strict=False):
                _assert_packed(got, q, f"{preset} {ftype} {shape} {path}")
            _assert_packed_decode(preset, shape, q, ftype, f"{preset} {ftype} {shape}")


def _assert_packed(got: dict, q: Any, where: str) -> None:
    """`cuda_aot.quantize_packed`'s fields equal the reference's compress-mode QTensor's."""
    np.testing.assert_array_equal(_bits(got["q"]), q.data, err_msg=where)
    np.testing.assert_array_equal(_bits(got["scale"]), q.scale, err_msg=where)
    if q.meta is not None:
        np.testing.assert_array_equal(_bits(got["meta"]), q.meta, err_msg=where)
    if q.tenscale is not None:
        np.testing.assert_array_equal(
            _bits(got["tenscale"]), q.tenscale.view(np.int32), err_msg=where
        )


def _assert_packed_decode(
    preset: str, shape: tuple, q: Any, ftype: str, where: str, axis: int = -1
) -> None:
    """`cuda_aot.dequantize_packed` of the reference's fields gives `onnxq.upcast`'s bits."""
    import torch

    from onnxq.cast import cuda_aot

    y = cuda_aot.dequantize_packed(
        preset,
        shape,
        _to_torch(q.data),
        _to_torch(q.scale),
        tenscale=None if q.tenscale is None else _to_torch(q.tenscale.astype(np.uint32)),
        meta=None if q.meta is None else _to_torch(q.meta),
        out_dtype=getattr(torch, ftype),
        axis=axis,
    )
    want = onnxq.upcast(q, _np_dtype(ftype))
    np.testing.assert_array_equal(_bits(y), _ref_bits(want), err_msg=where)


@gpu
@pytest.mark.parametrize("preset", PRESETS)
def test_tiles_along_a_non_last_axis_equal_the_reference(preset: str) -> None:
    """Tiles along an axis with elements after it (NCHW channels): the general kernels'
    LAST=False compile, values and codes, the packed layouts and back, every float type."""
    import torch

    from onnxq.cast import cuda_aot

    for i, (shape, axis) in enumerate([((2, 40, 3), 1), ((4, 64, 5, 5), 1), ((33, 7), 0)]):
        for ftype in TYPES:
            where = f"{preset} {ftype} {shape} axis {axis}"
            x = _data(shape, 20 + i).astype(_np_dtype(ftype))
            got = cuda_aot.quantize(_to_torch(x), preset, axis=axis)
            packed = cuda_aot.quantize_packed(_to_torch(x), preset, axis=axis)
            # values alone: the fast kernel's INNER compile where the axis is whole tiles
            alone = cuda_aot.quantize(_to_torch(x), preset, axis=axis, want_codes=False)
            torch.cuda.synchronize()
            ref = onnxq.cast(x, preset, backend="reference", axis=axis)
            np.testing.assert_array_equal(_bits(got["values"]), _ref_bits(ref), err_msg=where)
            np.testing.assert_array_equal(_bits(alone["values"]), _ref_bits(ref), err_msg=where)
            q = onnxq.cast(x, preset, mode="compress", backend="reference", axis=axis)
            _assert_packed(packed, q, where)
            _assert_packed_decode(preset, shape, q, ftype, where, axis)


# Modes other than the defaults (the general kernels' run-time parameters), every value of
# each over the list
GPU_MODES = [
    dict(round_mode="away", scale_mode="ceil"),
    dict(round_mode="zero", scale_mode="midmax", nan_policy="block"),
    dict(scale_mode="option3", int_range="full"),
    dict(scale_mode="topbinade", round_mode="away"),
    dict(scale_mode="rceil", nan_policy="block", int_range="full"),
    dict(scale_mode="even", round_mode="zero"),
]


@gpu
@pytest.mark.parametrize("preset", PRESETS)
def test_modes_equal_the_reference(preset: str) -> None:
    """Every preset under each of GPU_MODES: values and codes, the packed layouts, along the
    last axis (whole tiles: the fast kernel's shape for the default modes) and axis 0."""
    import torch

    from onnxq.cast import cuda_aot

    for i, modes in enumerate(GPU_MODES):
        for shape, axis in (((6, 64), -1), ((33, 7), 0)):
            where = f"{preset} {modes} {shape} axis {axis}"
            x = np.round(_data(shape, 40 + i) * 4) / 4  # quarters: rounding ties
            got = cuda_aot.quantize(_to_torch(x), preset, axis=axis, **modes)
            packed = cuda_aot.quantize_packed(_to_torch(x), preset, axis=axis, **modes)
            torch.cuda.synchronize()
            ref = onnxq.cast(x, preset, backend="reference", axis=axis, **modes)
            np.testing.assert_array_equal(_bits(got["values"]), _ref_bits(ref), err_msg=where)
            q = onnxq.cast(x, preset, mode="compress", backend="reference", axis=axis, **modes)
            _assert_packed(packed, q, where)


@gpu
@pytest.mark.parametrize("preset", ["mx6", "nvfp4"])
def test_misaligned_buffers_and_unwanted_meta(preset: str) -> None:
    """The fast kernels are compiled for 16-byte aligned buffers: a tensor 4 bytes into its
    storage takes the general kernels, with the same bits. Packed quantize without the Meta
    output (an onnxruntime node that does not ask for it) still writes Q."""
    import torch

    from onnxq.cast import cuda_aot
    from onnxq.cast.cuda_aot import _call, _lib, _stream

    shape = (8, 64)
    x = _data(shape, 1)
    base = torch.empty(x.size + 1, dtype=torch.float32, device="cuda")
    base[1:] = torch.from_numpy(x.reshape(-1)).cuda()
    xt = base[1:].view(shape)
    assert xt.data_ptr() % 16 == 4
    got = cuda_aot.quantize(xt, preset)
    q = onnxq.cast(x, preset, mode="actual", backend="reference")
    torch.cuda.synchronize()
    want = onnxq.cast(x, preset, backend="reference")
    np.testing.assert_array_equal(_bits(got["values"]), _ref_bits(want))
    np.testing.assert_array_equal(_bits(got["codes"]), q.data.astype(np.uint8))
    np.testing.assert_array_equal(_bits(got["scale"]), q.scale)

    c = onnxq.cast(x, preset, mode="compress", backend="reference")
    xa = _to_torch(x)
    qbuf = torch.empty(c.data.size, dtype=torch.uint8, device="cuda")
    sbuf = torch.empty(c.scale.shape, dtype=torch.uint8, device="cuda")
    tbuf = torch.zeros(1, dtype=torch.uint32, device="cuda")
    arr = (ctypes.c_int64 * 2)(*shape)
    for x_in in (xa, xt):  # fast, general
        _call(
            _lib().onnxq_cuda_quantize_packed,
            onnxq.datatype(preset).code.encode(),
            None,
            x_in.data_ptr(),
            0,
            2,
            arr,
            -1,
            qbuf.data_ptr(),
            sbuf.data_ptr(),
            tbuf.data_ptr() if c.tenscale is not None else None,
            None,
            _stream(xa.device, None),
        )
        torch.cuda.synchronize()
        np.testing.assert_array_equal(_bits(qbuf), c.data)
        np.testing.assert_array_equal(_bits(sbuf), c.scale)


# Codebooks the GPU tests decode: exact and masked blocks, long tiles, meta bits 0..2
CODEBOOKS = (
    ("cb41fi_e2m2fnuz_e8m0_t32", (7, 96)),
    ("cb41fi_e2m2fnuz_e8m0_t8s4", (3, 22)),
    ("cb42feie_e2m2fnuz_e8m0_t32s8", (2, 3, 45)),
    ("cb51fi_e3m3_e8m0_t64s16", (3, 100)),
    ("cb40f_e2m2fnuz_e8m0_t2048", (2, 3000)),
    ("cb81s201_e5m4fnuz_e8m0_t32s2", (4, 64)),
)


@gpu
@pytest.mark.parametrize(("code", "shape"), CODEBOOKS)
def test_codebook_lookup_equals_the_reference(code: str, shape: tuple[int, ...]) -> None:
    """CodebookLookup's launch path: the format-general decode images (and the unpacking),
    implicit codebooks through cuda_aot.lookup_packed, a generic one through the C ABI with its
    table."""
    import torch

    from onnxq.cast import cuda_aot
    from onnxq.cast.cuda_aot import _call, _lib, _stream

    x = _data(shape, 4)
    q = onnxq.cast(x, code, mode="compress", backend="reference")
    meta = None if q.meta is None else _to_torch(q.meta)
    for ftype in TYPES:
        y = cuda_aot.lookup_packed(
            code, shape, _to_torch(q.data), _to_torch(q.scale), meta,
            out_dtype=getattr(torch, ftype),
        )  # fmt: skip
        want = onnxq.upcast(q, _np_dtype(ftype))
        np.testing.assert_array_equal(_bits(y), _ref_bits(want), err_msg=f"{code} {ftype}")
    generic = "cb" + code[2:4] + code[code.index("_") :]  # the same widths, no description
    table = np.ascontiguousarray(onnxq.datatype(code).nspec.table(), dtype=np.float64)
    y = torch.empty(shape, dtype=torch.float32, device="cuda")
    qd, sd = _to_torch(q.data), _to_torch(q.scale)
    _call(
        _lib().onnxq_cuda_lookup_packed, generic.encode(), table.ctypes.data, len(shape),
        (ctypes.c_int64 * len(shape))(*shape), -1, qd.data_ptr(), sd.data_ptr(),
        None if meta is None else meta.data_ptr(), y.data_ptr(), 0, _stream(y.device, None),
    )  # fmt: skip
    torch.cuda.synchronize()
    np.testing.assert_array_equal(_bits(y), _ref_bits(onnxq.upcast(q)), err_msg=generic)


# GatherMX's tables: (dtype, shape, axis); rows that end inside a byte (33 or 45 codes of 4
# bits, 3 meta bits), shift bits, the tensor scale, tiles along axis 1 with elements after it
GATHERS = [
    ("mxfp4", (40, 33), -1),
    ("mx6", (17, 2, 20), -1),
    ("nvfp4", (9, 48), -1),
    ("mxfp8e4", (12, 70), -1),
    ("bfp16", (6, 64, 3), 1),
    ("cb41fi_e2m2fnuz_e8m0_t32", (8, 96), -1),
    ("cb42feie_e2m2fnuz_e8m0_t32s8", (5, 45), -1),
]


@gpu
@pytest.mark.parametrize(("code", "shape", "axis"), GATHERS)
def test_gathermx_launch_path_equals_the_reference(
    code: str, shape: tuple[int, ...], axis: int
) -> None:
    """GatherMX's launch path (cuda_aot.gather_packed: the row-copy image, then the decode):
    the reference decode of the table's rows, repeated and out of order, every output type."""
    import torch

    from onnxq.cast import cuda_aot

    # specials in row 0 only (a codebook tile with a NaN decodes to NaN), each row a magnitude
    # of its own (a row decoded with another row's scales shows)
    x = _data(shape, 5)
    x[1:] = np.nan_to_num(x[1:], nan=1.0, posinf=3.0, neginf=-3.0)
    x *= np.exp2(3.0 * (np.arange(shape[0]) % 8) - 8, dtype=np.float32).reshape(
        -1, *[1] * (len(shape) - 1)
    )
    q = onnxq.cast(x, code, mode="compress", backend="reference", axis=axis)
    rows = [shape[0] - 1, 0, 2, 2, 1]
    extra = {} if q.meta is None else {"meta": _to_torch(q.meta)}
    if q.tenscale is not None:
        extra["tenscale"] = _to_torch(q.tenscale.astype(np.uint32))
    for ftype in TYPES:
        y = cuda_aot.gather_packed(
            code, shape, rows, _to_torch(q.data), _to_torch(q.scale), **extra, axis=axis,
            out_dtype=getattr(torch, ftype),
        )  # fmt: skip
        torch.cuda.synchronize()
        want = np.take(onnxq.upcast(q, _np_dtype(ftype)), rows, axis=0)
        np.testing.assert_array_equal(_bits(y), _ref_bits(want), err_msg=f"{code} {ftype}")


def _ort_cuda() -> tuple[bool, str]:
    ok, why = _gpu_ready()
    if not ok:
        return ok, why
    try:
        import onnxruntime as ort
    except ImportError:
        return False, "onnxruntime not installed"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False, "onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu not installed)"
    return True, ""


def _cuda_y(nodes: list, shape: list[int], x: np.ndarray) -> np.ndarray:
    """Y of a graph X -> nodes -> Y (float32, `shape`) on onnxruntime's CUDA provider."""
    from onnx import TensorProto, helper

    import onnxq.runtime

    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    sess = onnxq.runtime.session(model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _pair_on_cuda(dtype: str, shape: list[int], seed: int, **attrs: Any) -> None:
    """QuantizeMX -> DequantizeMX on the CUDA provider gives the reference's bits."""
    from onnx import helper

    dt = onnxq.datatype(dtype)
    ts = "t" if dt.sspec.tenscale is not None else ""
    meta = "m" if dt.sspec.tiles[0].subtile else ""
    axis = attrs.get("axis", -1)
    nodes = [
        helper.make_node("QuantizeMX", ["x"], ["q", "s", "", ts, meta], domain="onnxq",
                         dtype=dtype, **attrs),
        helper.make_node("DequantizeMX", ["q", "s", "", ts, meta], ["y"], domain="onnxq",
                         dtype=dtype, shape=shape, axis=axis),
    ]  # fmt: skip
    x = _data(tuple(shape), seed)
    want = onnxq.cast(x, dtype, backend="reference", **attrs)
    np.testing.assert_array_equal(_ref_bits(_cuda_y(nodes, shape, x)), _ref_bits(want))


@pytest.mark.skipif(not _ort_cuda()[0], reason=f"no onnxruntime CUDA EP: {_ort_cuda()[1]}")
@pytest.mark.parametrize("preset", PRESETS)
def test_onnxruntime_cuda_ops_equal_the_reference(preset: str) -> None:
    _pair_on_cuda(preset, [6, 64], 3)


@pytest.mark.skipif(not _ort_cuda()[0], reason=f"no onnxruntime CUDA EP: {_ort_cuda()[1]}")
@pytest.mark.parametrize(("code", "shape"), CODEBOOKS[:3])
@pytest.mark.parametrize("generic", [False, True])
def test_onnxruntime_cuda_codebook_lookup(code: str, shape: tuple[int, ...], generic: bool) -> None:
    """CodebookLookup on the CUDA provider; generic: the same widths without a description,
    the mappings as the Table input (read from host memory)."""
    from onnx import TensorProto, helper, numpy_helper

    import onnxq.runtime

    x = _data(shape, 5)
    q = onnxq.cast(x, code, mode="compress", backend="reference")
    inits = [numpy_helper.from_array(q.data, "q"), numpy_helper.from_array(q.scale, "s")]
    meta = ""
    if q.meta is not None:
        inits.append(numpy_helper.from_array(q.meta, "m"))
        meta = "m"
    inputs, dtype = ["q", meta, "s"], code
    if generic:
        table = np.asarray(onnxq.datatype(code).nspec.table(), dtype=np.float32)
        inits.append(numpy_helper.from_array(table, "table"))
        inputs.append("table")
        dtype = "cb" + code[2:4] + code[code.index("_") :]
    node = helper.make_node(
        "CodebookLookup", inputs, ["y"], domain="onnxq", dtype=dtype, shape=list(shape)
    )
    graph = helper.make_graph(
        [node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        initializer=inits,
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    sess = onnxq.runtime.session(model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    (y,) = sess.run(None, {})
    np.testing.assert_array_equal(_ref_bits(y), _ref_bits(onnxq.upcast(q)))


@pytest.mark.skipif(not _ort_cuda()[0], reason=f"no onnxruntime CUDA EP: {_ort_cuda()[1]}")
@pytest.mark.parametrize(
    ("dtype", "attrs"),
    [
        ("mxfp4", {"axis": 0}),  # the general kernels' LAST=False compile
        ("mx6", {"axis": 0}),
        ("int8_e8m0_t8_t4", {}),  # no GPU kernel: the CPU op on host copies
        ("mxfp8e4", {"round_mode": "stochastic", "seed": 3}),  # the same
        ("mxfp8e4", {"round_mode": "away", "scale_mode": "ceil"}),  # the general kernels
        ("mx6", {"nan_policy": "block", "int_range": "full"}),
    ],
)
def test_onnxruntime_cuda_other_axes_and_host_fallback(dtype: str, attrs: dict) -> None:
    _pair_on_cuda(dtype, [8, 64], 4, **attrs)


@pytest.mark.skipif(not _ort_cuda()[0], reason=f"no onnxruntime CUDA EP: {_ort_cuda()[1]}")
@pytest.mark.parametrize("preset", PRESETS)
def test_onnxruntime_cuda_quant_dequant_equals_the_reference(preset: str) -> None:
    """QuantizeDequantizeMX (the activations' fused cast) on the CUDA provider."""
    from onnx import helper

    shape = [6, 40]  # a last axis the fast kernels do not take for tiles of 32: the general
    node = helper.make_node("QuantizeDequantizeMX", ["x"], ["y"], domain="onnxq", dtype=preset)
    x = _data(tuple(shape), 6)
    want = onnxq.cast(x, preset, backend="reference")
    np.testing.assert_array_equal(_ref_bits(_cuda_y([node], shape, x)), _ref_bits(want))
