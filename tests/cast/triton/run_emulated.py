"""The library's CUDA path on the CPU (`fake_cuda`): the cases `test_cuda_emulated` checks.

Run as a script in a process with ``TRITON_INTERPRET=1`` and ``ONNXQ_LIBCUDA`` naming the built
fake driver; prints one JSON object: ``bad`` (cases whose bits differ from the reference, or
that failed), ``refused`` (case -> the library's message), ``launches`` (case -> the kernels the
library launched, in order) and ``errors`` (exceptions in the launch callback).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import onnxq

_ = onnxq.cast
from fake_cuda import Emulator  # noqa: E402

from onnxq.cast import cuda_aot  # noqa: E402
from onnxq.cast.aot_spec import PRESETS  # noqa: E402
from onnxq.formats.datatype import datatype  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
AOT = ROOT / "ops" / "build" / "aot"
OUT_TYPES = {0: np.float32, 1: np.float16, 2: ml_dtypes.bfloat16}

# (dtype, shape, output type): blocks that fit exactly and masked ones, subtiles, meta bits
# 0..2, index bits 3..8, t0 (the whole axis), partial last tiles, long chunked tiles
LOOKUPS = [
    ("cb41fi_e2m2fnuz_e8m0_t8s4", (3, 20), 0),
    ("cb41fi_e2m2fnuz_e8m0_t32", (2, 70), 1),
    ("cb41fi_e2m2fnuz_e8m0_t32s8", (4, 64), 2),
    ("cb51fi_e3m3_e8m0_t64s16", (3, 100), 0),
    ("cb30f_e2m3_e5m0_t16", (5, 37), 0),
    ("cb40f_e2m2fnuz_e8m0_t128", (2, 130), 0),
    ("cb40f_e2m2fnuz_e8m0_t", (3, 96), 2),
    ("cb42feie_e2m2fnuz_e8m0_t32s8", (2, 3, 45), 1),
    ("cb81s201_e5m4fnuz_e8m0_t32s2", (2, 64), 0),
    ("cb40f_e2m2fnuz_e8m0_t2048", (2, 3000), 0),
    ("cb41fi_e2m2fnuz_e8m0_t4096", (1, 700), 1),
    ("cb41fi_e2m2fnuz_e8m0_t256s32", (2, 300), 0),
]
# (dtype, shape, axis, output type): tiles along a non-last axis (the blocks' LAST=False
# compile): subtiles, partial tiles, a long chunked tile
LOOKUPS_AXIS = [
    ("cb41fi_e2m2fnuz_e8m0_t32s8", (3, 45, 2), 1, 0),
    ("cb51fi_e3m3_e8m0_t64s16", (100, 3), 0, 2),
    ("cb40f_e2m2fnuz_e8m0_t2048", (2, 3000, 2), 1, 1),
]
# generic codebooks: decoded with the implicit one's mappings as the table
GENERIC = [("cb41_e2m2fnuz_e8m0_t8s4", "cb41fi_e2m2fnuz_e8m0_t8s4", (3, 24), 0)]


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view({4: np.int32, 2: np.int16}[a.dtype.itemsize])


def _input(shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-8, 8, shape))).astype(np.float32)
    flat = x.reshape(-1)
    flat[::11] = 0.0
    flat[5::29] = np.nan  # NaN tiles decode to NaN
    flat[7::31] = -np.inf
    return x


class Run:
    def __init__(self) -> None:
        m = json.loads((AOT / "manifest.json").read_text())
        self.emu = Emulator(
            Path(os.environ["ONNXQ_LIBCUDA"]), m, (AOT / "kernels.bin").read_bytes()
        )
        self.lib = cuda_aot._lib()
        self.bad: list[str] = []
        self.refused: dict[str, str] = {}
        self.launches: dict[str, list[str]] = {}
        self.tensors: list[Any] = []  # registered torch buffers (kept alive)

    def dev(self, a: np.ndarray | None) -> int | None:
        return None if a is None else self.emu.device(np.ascontiguousarray(a))

    def call(self, name: str, fn: Any, *args: Any) -> bool:
        err = ctypes.create_string_buffer(1024)
        first = len(self.emu.log)
        rc = fn(*args, err, 1024)
        self.launches[name] = self.emu.log[first:]
        if rc != 0:
            self.refused[name] = err.value.decode()
        return rc == 0

    def lookup(
        self,
        name: str,
        code: str,
        shape: tuple[int, ...],
        q: Any,
        out: int,
        table: np.ndarray | None = None,
        axis: int = -1,
    ) -> np.ndarray | None:
        y = np.zeros(shape, OUT_TYPES[out])
        tab = None if table is None else np.ascontiguousarray(table, np.float64)
        ok = self.call(
            name, self.lib.onnxq_cuda_lookup_packed, code.encode(),
            None if tab is None else tab.ctypes.data, len(shape),
            (ctypes.c_int64 * len(shape))(*shape), axis, self.dev(q.data), self.dev(q.scale),
            self.dev(q.meta), self.dev(y), out, None,
        )  # fmt: skip
        return y if ok else None

    def check(self, name: str, got: np.ndarray | None, want: np.ndarray) -> None:
        if got is None or not np.array_equal(_bits(got), _bits(want)):
            self.bad.append(name)


def lookups(r: Run) -> None:
    for i, (code, shape, out) in enumerate(LOOKUPS):
        x = _input(shape, i)
        q = onnxq.cast(x, code, mode="compress", backend="reference")
        r.check(code, r.lookup(code, code, shape, q, out), onnxq.upcast(q, OUT_TYPES[out]))
    for code, shape, axis, out in LOOKUPS_AXIS:
        x = _input(shape, 40 + axis)
        q = onnxq.cast(x, code, mode="compress", backend="reference", axis=axis)
        name = f"{code} {shape} axis {axis}"
        r.check(
            name, r.lookup(name, code, shape, q, out, axis=axis), onnxq.upcast(q, OUT_TYPES[out])
        )
    for generic, implicit, shape, out in GENERIC:
        x = _input(shape, 99)
        q = onnxq.cast(x, implicit, mode="compress", backend="reference")
        table = np.asarray(datatype(implicit).nspec.table(), np.float64)
        name = f"{generic} (table)"
        r.check(
            name, r.lookup(name, generic, shape, q, out, table), onnxq.upcast(q, OUT_TYPES[out])
        )


def refusals(r: Run) -> None:
    shape = (4, 64)
    x = _input(shape, 5)
    q = onnxq.cast(x, "cb41fi_e2m2fnuz_e8m0_t32", mode="compress", backend="reference")
    for name, code in (
        ("2-d tiles", "cb41fi_e2m2fnuz_e8m0_t4_t8"),
        ("sparsity", "cb41fi_e2m2fnuz_e8m0_t32n2m4"),
        ("wide scale", "cb41fi_e2m2fnuz_e10m0_t32"),
        ("long tile with subtiles", "cb41fi_e2m2fnuz_e8m0_t2048s8"),
        ("subtiles of 64", "cb41fi_e2m2fnuz_e8m0_t128s64"),
        ("not a codebook", "mxfp4"),
        ("generic without a table", "cb41_e2m2fnuz_e8m0_t32"),
    ):
        r.lookup(name, code, shape, q, 0)
    y = np.zeros(shape, np.float32)
    host = q.data.copy()  # never registered: host memory
    r.call(
        "host memory", r.lib.onnxq_cuda_lookup_packed, b"cb41fi_e2m2fnuz_e8m0_t32", None, 2,
        (ctypes.c_int64 * 2)(*shape), -1, host.ctypes.data, r.dev(q.scale), r.dev(q.meta),
        r.dev(y), 0, None,
    )  # fmt: skip
    r.call(
        "no meta", r.lib.onnxq_cuda_lookup_packed, b"cb41fi_e2m2fnuz_e8m0_t32", None, 2,
        (ctypes.c_int64 * 2)(*shape), -1, r.dev(q.data), r.dev(q.scale), None, r.dev(y), 0,
        None,
    )  # fmt: skip


# the last axis a multiple of every preset's tile (the fast kernels), and of none (the general
# ones: 36 is not a multiple of 8, 16 or 32)
PRESET_SHAPES = ((3, 64), (3, 36))


def _preset_input(shape: tuple[int, ...], seed: int, x_type: int) -> tuple[np.ndarray, np.ndarray]:
    """(what the library reads, the float32 values the reference casts)."""
    x = _input(shape, seed)
    if x_type == 2:
        xb = x.astype(ml_dtypes.bfloat16)
        return xb.view(np.uint16), xb.astype(np.float32)
    return x, x


def _c_modes(modes: dict[str, Any] | None) -> Any:
    """The C ABI's modes for `onnxq.cast`'s mode arguments (None: NULL, the defaults)."""
    if modes is None:
        return None
    return cuda_aot._modes(
        modes.get("round_mode", "even"),
        modes.get("scale_mode", "floor"),
        modes.get("nan_policy", "element"),
        modes.get("int_range", "symmetric"),
    )


def _quantize_packed(
    r: Run,
    name: str,
    preset: str,
    x: np.ndarray,
    x_type: int,
    want,
    axis: int = -1,
    modes: dict[str, Any] | None = None,
) -> None:
    q = np.zeros(want.data.size, np.uint8)
    scale = np.zeros(want.scale.size, np.uint8)
    meta = None if want.meta is None else np.zeros(want.meta.size, np.uint8)
    ts = None if want.tenscale is None else np.zeros(1, np.uint32)
    shape = x.shape
    if r.call(
        name, r.lib.onnxq_cuda_quantize_packed, preset.encode(), _c_modes(modes), r.dev(x), x_type,
        len(shape), (ctypes.c_int64 * len(shape))(*shape), axis, r.dev(q), r.dev(scale),
        r.dev(ts), r.dev(meta), None,
    ):  # fmt: skip
        if not (np.array_equal(q, want.data) and _fields_match(want, scale, meta, ts)):
            r.bad.append(name)
    else:
        r.bad.append(name)


def _fields_match(want: Any, scale: np.ndarray, meta: Any, ts: Any) -> bool:
    """Scale, meta and tensor scale as the reference's QTensor ``want`` has them."""
    same = np.array_equal(scale, want.scale.ravel())
    if meta is not None:
        same &= np.array_equal(meta, want.meta.ravel())
    if ts is not None:
        same &= int(ts[0]) == int(want.tenscale[0])
    return bool(same)


def _quantize_unpacked(
    r: Run,
    name: str,
    preset: str,
    x: np.ndarray,
    xr: np.ndarray,
    axis: int = -1,
    modes: dict[str, Any] | None = None,
) -> None:
    """Values and codes in one call (the general kernel writes both; the fast path two passes)."""
    cast_modes = modes or {}
    want = onnxq.cast(xr, preset, mode="actual", backend="reference", axis=axis, **cast_modes)
    values = np.zeros_like(x)
    codes = np.zeros(x.shape, np.uint8)
    scale = np.zeros(want.scale.size, np.uint8)
    meta = None if want.meta is None else np.zeros(want.meta.size, np.uint8)
    ts = None if want.tenscale is None else np.zeros(1, np.uint32)
    if not r.call(
        name, r.lib.onnxq_cuda_quantize, preset.encode(), _c_modes(modes), r.dev(x), 0, x.ndim,
        (ctypes.c_int64 * x.ndim)(*x.shape), axis, r.dev(values), r.dev(codes), r.dev(scale),
        r.dev(ts), r.dev(meta), None,
    ):  # fmt: skip
        r.bad.append(name)
        return
    ref = onnxq.cast(xr, preset, backend="reference", axis=axis, **cast_modes)
    same = np.array_equal(_bits(values), _bits(ref))
    same &= np.array_equal(codes, want.data.astype(np.uint8))
    if not (same and _fields_match(want, scale, meta, ts)):
        r.bad.append(name)


def presets(r: Run) -> None:
    """The preset launchers through the library: every preset, the fast and the general
    kernels (by shape, by ONNXQ_CUDA_FAST=0, by a misaligned input), float32 and bfloat16
    input, packed and unpacked layouts, NVFP4's tensor amax, dequantize with unpacking."""
    for i, preset in enumerate(PRESETS):
        for shape in PRESET_SHAPES:
            tag = f"{preset} {shape}"
            for x_type in (0, 2):
                x, xr = _preset_input(shape, 50 + i, x_type)
                want = onnxq.cast(xr, preset, mode="compress", backend="reference")
                _quantize_packed(r, f"{tag} quantize {x_type}", preset, x, x_type, want)
            x, xr = _preset_input(shape, 50 + i, 0)
            want = onnxq.cast(xr, preset, mode="compress", backend="reference")
            _quantize_unpacked(r, f"{tag} unpacked", preset, x, xr)
            if shape[-1] % 32 == 0:
                os.environ["ONNXQ_CUDA_FAST"] = "0"  # read at each call
                _quantize_packed(r, f"{tag} quantize general", preset, x, 0, want)
                del os.environ["ONNXQ_CUDA_FAST"]
                # 4 bytes into a buffer: not 16-byte aligned, so the general kernels
                buf = np.zeros(x.size + 4, np.float32)
                off = (16 - buf.ctypes.data % 16) % 16 // 4 + 1
                xm = buf[off : off + x.size].reshape(shape)
                xm[...] = x
                _quantize_packed(r, f"{tag} quantize misaligned", preset, xm, 0, want)
            for out in (0, 2):
                _dequantize_packed(r, f"{tag} dequantize {out}", preset, shape, want, out)
        inner_axis(r, i, preset)


def _dequantize_packed(
    r: Run, name: str, preset: str, shape: tuple[int, ...], want: Any, out: int, axis: int = -1
) -> None:
    y = np.zeros(shape, OUT_TYPES[out])
    r.call(
        name, r.lib.onnxq_cuda_dequantize_packed, preset.encode(), len(shape),
        (ctypes.c_int64 * len(shape))(*shape), axis, r.dev(want.data), r.dev(want.scale),
        r.dev(want.tenscale), r.dev(want.meta), r.dev(y), out, None,
    )  # fmt: skip
    r.check(name, y, onnxq.upcast(want, OUT_TYPES[out]))


# tiles along axis 1 with elements after it (NCHW-like): the general kernels' LAST=False
# compile; axis 1 of length 40 leaves a partial tile, and its subtiles for MX6
INNER_SHAPE = (2, 36, 3)  # 36: a multiple of no tile (the general kernels)


def inner_axis(r: Run, i: int, preset: str) -> None:
    """A preset tiled along a non-last axis: packed and unpacked quantize, dequantize."""
    tag = f"{preset} {INNER_SHAPE} axis 1"
    for x_type in (0, 2):
        x, xr = _preset_input(INNER_SHAPE, 60 + i, x_type)
        want = onnxq.cast(xr, preset, mode="compress", backend="reference", axis=1)
        _quantize_packed(r, f"{tag} quantize {x_type}", preset, x, x_type, want, axis=1)
    x, xr = _preset_input(INNER_SHAPE, 60 + i, 0)
    _quantize_unpacked(r, f"{tag} unpacked", preset, x, xr, axis=1)
    want = onnxq.cast(xr, preset, mode="compress", backend="reference", axis=1)
    for out in (0, 2):
        _dequantize_packed(r, f"{tag} dequantize {out}", preset, INNER_SHAPE, want, out, 1)


# Modes other than the defaults, each mode's every value over the presets (the general
# kernels take them at run time; the fast kernel's shapes must not take it)
MODE_CASES = [
    dict(round_mode="away", scale_mode="ceil"),
    dict(round_mode="zero", scale_mode="midmax", nan_policy="block"),
    dict(scale_mode="option3", int_range="full"),
    dict(scale_mode="topbinade", round_mode="away", nan_policy="block"),
    dict(scale_mode="rceil", round_mode="zero", int_range="full"),
    dict(scale_mode="even"),
]
MODE_SHAPE = (4, 64)  # whole tiles along the last axis: the fast kernel's, had the modes been


def _tie_input(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Quarter-integers up to 256, each row scaled by a power of two: many elements fall on
    a rounding tie of every preset (where even, away and zero differ), tiles' maxima on both
    sides of the scale modes' thresholds; a NaN and an Inf in some tiles (the NaN policies)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-1024, 1025, shape).astype(np.float32) / 4
    x *= np.exp2(rng.integers(-4, 5, (*shape[:-1], 1))).astype(np.float32)
    flat = x.reshape(-1)
    flat[37] = np.nan
    flat[-3] = np.inf
    return x


def modes(r: Run) -> None:
    """Every preset under each of MODE_CASES: packed and unpacked quantize (float32)."""
    for i, preset in enumerate(PRESETS):
        for j, case in enumerate(MODE_CASES):
            x = _tie_input(MODE_SHAPE, 300 + 10 * i + j)
            tag = f"{preset} modes {j}"
            want = onnxq.cast(x, preset, mode="compress", backend="reference", **case)
            _quantize_packed(r, f"{tag} packed", preset, x, 0, want, modes=case)
            _quantize_unpacked(r, f"{tag} unpacked", preset, x, x, modes=case)
    # refused, before any launch
    x = _tie_input(MODE_SHAPE, 399)
    q, scale = np.zeros(x.size, np.uint8), np.zeros(x.size // 32, np.uint8)
    for name, case in (
        ("modes stochastic", dict(round_mode="stochastic")),
        ("modes search", dict(scale_mode="search")),
    ):
        r.call(
            name, r.lib.onnxq_cuda_quantize_packed, b"mxfp8e4", _c_modes(case), r.dev(x), 0, 2,
            (ctypes.c_int64 * 2)(*x.shape), -1, r.dev(q), r.dev(scale), None, None, None,
        )  # fmt: skip


# whole tiles along axis 1 with elements after it: the fast values and codes kernels' INNER
# compiles (fewer inner positions than a program's tiles; more, so a row of tiles takes
# programs)
INNER_FAST_SHAPES = ((2, 64, 3), (1, 32, 300))


def inner_fast(r: Run) -> None:
    """Whole tiles along a non-last axis: values alone (QuantizeDequantizeMX's cast), values
    and codes (two INNER passes), the packed layouts (the codes pass, then the pack kernels)."""
    for i, preset in enumerate(PRESETS):
        for j, shape in enumerate(INNER_FAST_SHAPES):
            tag = f"{preset} {shape} axis 1"
            x, xr = _preset_input(shape, 200 + i, 0)
            _quantize_unpacked(r, f"{tag} unpacked", preset, x, xr, axis=1)
            want = onnxq.cast(xr, preset, mode="compress", backend="reference", axis=1)
            _quantize_packed(r, f"{tag} packed", preset, x, 0, want, axis=1)
            x_type = 2 if j == 0 else 0
            x, xr = _preset_input(shape, 200 + i, x_type)
            y = np.zeros_like(x)
            name = f"{preset} {shape} axis 1 values"
            if r.call(
                name, r.lib.onnxq_cuda_quantize, preset.encode(), None, r.dev(x), x_type, 3,
                (ctypes.c_int64 * 3)(*shape), 1, r.dev(y), None, None, None, None, None,
            ):  # fmt: skip
                want = onnxq.cast(xr, preset, backend="reference", axis=1)
                if x_type == 2:
                    want = want.astype(ml_dtypes.bfloat16).view(np.uint16)
                if not np.array_equal(_bits(y), _bits(want)):
                    r.bad.append(name)
            else:
                r.bad.append(name)


# formats the library embeds under another name: preset names (the same code) in any case,
# the canonical code, and the code's other spellings (any case, torch's element names, e4m3
# for e4m3fn, a subtile of 0)
ALIASES = (
    ("mxfp8", "mxfp8e4"),
    ("MXINT4", "bfp8"),
    ("e4m3fn_e8m0_t32", "mxfp8e4"),
    ("E4M3FN_E8M0_T32", "mxfp8e4"),
    ("float8_e4m3fn_e8m0_t32", "mxfp8e4"),
    ("e4m3_e8m0_t32", "mxfp8e4"),
    ("int8_e8m0_t16s0", "bfp16"),
    ("Int8_E8M0_T8", "int8_e8m0_t8"),
)


def aliases(r: Run) -> None:
    """A dtype naming an embedded format by another preset name or by its code."""
    for i, (alias, preset) in enumerate(ALIASES):
        x = _input((3, 64), 90 + i)
        want = onnxq.cast(x, preset, mode="compress", backend="reference")
        _quantize_packed(r, f"alias {alias}", alias, x, 0, want)


@contextlib.contextmanager
def _cpu_as_cuda(r: Run) -> Iterator[None]:
    """`onnxq.cast.cuda_aot`'s wrappers on CPU tensors: what they allocate is registered as
    device memory, the CUDA checks and the stream query are skipped (the fake driver is the
    only CUDA here)."""
    import torch

    from onnxq.cast import cuda_aot

    saved = (torch.empty, torch.empty_like, torch.zeros, cuda_aot._check, cuda_aot._stream)

    def registered(make: Any) -> Any:
        def alloc(*args: Any, **kwargs: Any) -> Any:
            kwargs.pop("device", None)
            t = make(*args, **kwargs)
            r.emu.lib.fake_register(t.data_ptr(), max(t.numel() * t.element_size(), 1))
            r.tensors.append(t)
            return t

        return alloc

    torch.empty, torch.empty_like, torch.zeros = (registered(f) for f in saved[:3])
    cuda_aot._check = lambda t, name: None
    cuda_aot._stream = lambda device, stream: 0
    try:
        yield
    finally:
        torch.empty, torch.empty_like, torch.zeros, cuda_aot._check, cuda_aot._stream = saved


def wrappers(r: Run) -> None:
    """The Python wrappers of `onnxq.cast.cuda_aot` (argument order, sizes, layouts)."""
    import torch

    from onnxq.cast import cuda_aot

    def dev(a: np.ndarray | None) -> Any:
        if a is None:
            return None
        a = np.ascontiguousarray(a)
        r.dev(a)
        return torch.from_numpy(a)

    def bits(t: Any) -> np.ndarray:
        return _bits(t.view(torch.int16 if t.element_size() == 2 else torch.int32).numpy())

    implicit = "cb42feie_e2m2fnuz_e8m0_t32s8"
    generic = datatype("cb42_e2m2fnuz_e8m0_t32s8")
    generic = dataclasses.replace(
        generic, nspec=generic.nspec.add_mappings(datatype(implicit).nspec.magnitudes())
    )
    shape = (3, 45)
    q = onnxq.cast(_input(shape, 70), implicit, mode="compress", backend="reference")
    with _cpu_as_cuda(r):
        for name, dt in (
            ("wrapper lookup implicit", implicit),
            ("wrapper lookup generic", generic),
        ):
            y = cuda_aot.lookup_packed(
                dt, shape, dev(q.data), dev(q.scale), dev(q.meta), out_dtype=torch.bfloat16
            )
            if not np.array_equal(bits(y), _bits(onnxq.upcast(q, ml_dtypes.bfloat16))):
                r.bad.append(name)
            # GatherMX's launch path: rows of 45 4-bit codes (180 bits), repeated, out of order
            y = cuda_aot.gather_packed(
                dt, shape, [1, 1, 0], dev(q.data), dev(q.scale), meta=dev(q.meta),
                out_dtype=torch.bfloat16,
            )  # fmt: skip
            want_rows = np.take(onnxq.upcast(q, ml_dtypes.bfloat16), [1, 1, 0], axis=0)
            if not np.array_equal(bits(y), _bits(want_rows)):
                r.bad.append(name.replace("lookup", "gather"))
        for preset, shp in (("mx6", (3, 64)), ("nvfp4", (3, 40))):
            x = _input(shp, 71)
            want = onnxq.cast(x, preset, mode="compress", backend="reference")
            got = cuda_aot.quantize_packed(dev(x), preset)
            fields = {"q": want.data, "scale": want.scale, "meta": want.meta}
            fields["tenscale"] = want.tenscale
            same = all(
                np.array_equal(got[k].numpy().ravel(), np.ravel(v).view(got[k].numpy().dtype))
                for k, v in fields.items()
                if v is not None
            )
            y = cuda_aot.dequantize_packed(
                preset, shp, dev(want.data), dev(want.scale), tenscale=dev(want.tenscale),
                meta=dev(want.meta),
            )  # fmt: skip
            same &= np.array_equal(bits(y), _bits(onnxq.upcast(want)))
            unpacked = cuda_aot.quantize(dev(x), preset)
            same &= np.array_equal(
                bits(unpacked["values"]), _bits(onnxq.cast(x, preset, backend="reference"))
            )
            y = cuda_aot.gather_packed(
                preset, shp, torch.tensor([2, 0, 2]), dev(want.data), dev(want.scale),
                tenscale=dev(want.tenscale), meta=dev(want.meta),
            )  # fmt: skip
            same &= np.array_equal(bits(y), _bits(np.take(onnxq.upcast(want), [2, 0, 2], 0)))
            if not same:
                r.bad.append(f"wrappers {preset}")
        # GatherMX's refusals, before any launch: a row past the table, tiles along the rows
        # (the same packed sizes for both tables)
        t = onnxq.cast(_input((64, 3), 73), "mxfp4", mode="compress", backend="reference", axis=0)
        for name, shp, rows, axis in (
            ("wrapper gather row 3", (3, 64), [0, 3], -1),
            ("wrapper gather axis 0", (64, 3), [0], 0),
        ):
            first = len(r.emu.log)
            try:
                cuda_aot.gather_packed("mxfp4", shp, rows, dev(t.data), dev(t.scale), axis=axis)
                r.bad.append(name)
            except RuntimeError as err:
                r.refused[name] = str(err)
            r.launches[name] = r.emu.log[first:]
        # tiles along axis 1 (elements after it): the grids the wrappers size, the axis passed
        x = _input(INNER_SHAPE, 72)
        want = onnxq.cast(x, "mx6", mode="compress", backend="reference", axis=1)
        got = cuda_aot.quantize_packed(dev(x), "mx6", axis=1)
        same = all(
            np.array_equal(got[k].numpy().ravel(), np.ravel(v))
            for k, v in (("q", want.data), ("scale", want.scale), ("meta", want.meta))
        )
        y = cuda_aot.dequantize_packed(
            "mx6", INNER_SHAPE, dev(want.data), dev(want.scale), meta=dev(want.meta), axis=1
        )
        same &= np.array_equal(bits(y), _bits(onnxq.upcast(want)))
        qc = onnxq.cast(x, implicit, mode="compress", backend="reference", axis=1)
        y = cuda_aot.lookup_packed(
            implicit, INNER_SHAPE, dev(qc.data), dev(qc.scale), dev(qc.meta), axis=1
        )
        same &= np.array_equal(bits(y), _bits(onnxq.upcast(qc)))
        unpacked = cuda_aot.quantize(dev(x), "nvfp4", axis=0)
        ref = onnxq.cast(x, "nvfp4", backend="reference", axis=0)
        same &= np.array_equal(bits(unpacked["values"]), _bits(ref))
        if not same:
            r.bad.append("wrappers axis")


def main() -> None:
    r = Run()
    lookups(r)
    refusals(r)
    presets(r)
    modes(r)
    inner_fast(r)
    aliases(r)
    wrappers(r)
    print(json.dumps(dict(bad=r.bad, refused=r.refused, launches=r.launches, errors=r.emu.errors)))


if __name__ == "__main__":
    main()
