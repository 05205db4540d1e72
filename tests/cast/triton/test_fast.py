"""The Triton fast path (dense last-axis tiles, float arithmetic) against the numpy reference.

The fast path replaces the general kernel's integer emulation by float32 tricks whose
exactness rests on margins (underflow below 2^-126, the magic-number rounding, codes from
shifted float bits). These tests aim at those margins: tiles whose scale clamps at the
bottom or top of E8M0, subnormal inputs, values next to FLT_MAX, ties on every grid, tiles of
one nonzero, NaN/Inf in every policy, and program blocks that end inside the tensor. Without a
GPU they run in Triton's interpreter; on one, on CUDA tensors.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.cast.triton.support import GPU, assert_same, assert_same_qtensor, compare, to_torch

# isort: split
import onnxq
from onnxq.cast import triton_fast as tf
from onnxq.cast.aot_spec import PRESETS
from onnxq.cast.api import cast, upcast
from onnxq.cast.torch_bridge import upcast_triton
from onnxq.formats.datatype import datatype
from onnxq.formats.modes import RoundMode

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
# every MX / BFP / NVFP4 preset with 1-D tiles (those the C library embeds) and an alias
FAST = [*PRESETS, "mxint4"]
FLOAT_FAST = ["mxfp8e4", "mxfp8e5", "mxfp6e2", "mxfp6e3", "mxfp4", "nvfp4"]


def hostile(shape: tuple[int, ...], tile: int, seed: int) -> np.ndarray:
    """Tiles of very different magnitudes, with the values the float tricks must survive."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    rows = x.reshape(-1, tile)
    exps = rng.integers(-140, 126, size=rows.shape[0]).astype(np.float32)
    rows *= np.float32(2.0) ** exps[:, None]
    n = rows.shape[0]
    fmax = np.finfo(np.float32).max
    specials = [
        lambda r: r.fill(0.0),  # an all-zero tile
        lambda r: r.__setitem__(slice(None), 0.0) or r.__setitem__(3, -1e-41),  # one subnormal
        lambda r: r.__setitem__(slice(None), rng.standard_normal(tile) * 1e-40),  # subnormals
        lambda r: r.__setitem__(0, fmax),  # the largest finite value
        lambda r: r.__setitem__(slice(None), -fmax),
        lambda r: r.__setitem__(slice(None), np.arange(tile) / 8.0 - tile / 16.0),  # ties
        lambda r: r.__setitem__(slice(None), np.arange(tile) * 0.25 + 0.125),
        lambda r: r.__setitem__(1, np.nan),
        lambda r: r.__setitem__(2, -np.inf),
        lambda r: r.__setitem__(slice(None), np.nan),  # a NaN-only tile
        lambda r: r.__setitem__(slice(None), rng.integers(-600, 600, tile) / 4.0),
        lambda r: r.__setitem__(0, 2.0**-126) or r.__setitem__(slice(1, None), 2.0**-149),
        lambda r: r.__setitem__(slice(None), -0.0),
    ]
    for k, apply in enumerate(specials):
        if k < n:
            apply(rows[(k * 7) % n])
    return rows.reshape(shape)


def check(x: np.ndarray, name: str, dtype: str, modes=("virtual", "actual", "compress"), **kw):
    rmode = RoundMode.parse(kw.get("round_mode", "even"))
    axis = kw.get("axis", -1)
    assert tf.fast_plan(tuple(x.shape), datatype(name), axis, rmode) is not None, name
    compare(
        x,
        dtype,
        modes,
        lambda xn, mode: cast(xn, name, mode=mode, backend="reference", **kw),
        lambda xt, mode: cast(xt, name, mode=mode, backend="triton", **kw),
        upcast_triton,
        (dtype,),
        lambda mode: f"{name} {dtype} {mode} {kw}",
    )


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", FAST)
def test_presets_on_hostile_tiles(name: str, dtype: str) -> None:
    tile = datatype(name).sspec.tiles[0].size
    # 3 x 5 rows of 4 tiles: 60 tiles, so the last program block ends inside the tensor
    shape = (3, 5, 4 * tile) if not GPU else (37, 3, 16 * tile)
    check(hostile(shape, tile, seed=len(name)), name, dtype)


@pytest.mark.parametrize("name", FAST)
def test_tiles_along_a_non_last_axis(name: str) -> None:
    """Tiles along an axis with elements after it (NCHW channels): the kernel's INNER block
    of tiles side by side. Fewer inner positions than a program's tiles (masked), more (two
    programs a tile row, the second partial), the scale and shift-bit grids, every mode's
    layout (compress packs the unpacked codes afterwards)."""
    tile = datatype(name).sspec.tiles[0].size
    bt = tf._BLOCK // tile
    for i, (outer, tiles, inner) in enumerate([(2, 2, 5), (1, 1, bt + 3)]):
        # hostile tiles along the last axis, moved to axis 1
        h = hostile((outer, inner, tiles * tile), tile, seed=len(name) + i)
        x = np.ascontiguousarray(np.moveaxis(h, 2, 1))
        plan = tf.fast_plan(x.shape, datatype(name), 1, RoundMode.EVEN)
        assert plan is not None and plan.inner == inner and plan.axis == 1
        check(x, name, "float32" if i else "bfloat16", axis=1)
    # only size-1 dims after the axis: the last-axis block, the grids shaped for axis 1
    x = hostile((2, 2 * tile), tile, seed=len(name))[:, :, None]
    plan = tf.fast_plan(x.shape, datatype(name), 1, RoundMode.EVEN)
    assert plan is not None and plan.inner == 1 and plan.axis == 1
    check(x, name, "float32", axis=1)


@pytest.mark.parametrize(
    "scale_mode", ["floor", "ceil", "midmax", "option3", "topbinade", "rceil", "even"]
)
def test_scale_modes(scale_mode: str) -> None:
    for name in ("mxfp8e4", "mxfp6e3", "mxfp4", "mxint8"):
        x = hostile((16, 64), 32, seed=3)
        x[0, :32] = 448.0
        x[1, :32] = 464.0
        x[2, :32] = 7.5
        x[3, :32] = np.nextafter(np.float32(480.0), np.float32(0))
        check(x, name, "float32", modes=("virtual", "actual"), scale_mode=scale_mode)


@pytest.mark.parametrize("nan_policy", ["element", "block"])
def test_nan_policies(nan_policy: str) -> None:
    for name in ("mxfp8e4", "mxfp4", "mxint8", "mx6", "nvfp4"):
        tile = datatype(name).sspec.tiles[0].size
        x = hostile((6, 4 * tile), tile, seed=11)
        x[0, 3] = np.nan
        x[1, 5] = np.inf
        x[2, 7] = np.float32(np.uint32(0xFF800001).view(np.float32))  # a NaN payload
        for dtype in ("float32", "bfloat16"):
            check(x, name, dtype, nan_policy=nan_policy)


def test_full_int_range() -> None:
    for name in ("mxint8", "bfp16", "mx6", "mx9", "mxint4"):
        tile = datatype(name).sspec.tiles[0].size
        x = hostile((4, 2 * tile), tile, seed=9)
        x[0, :4] = [-128.0, 127.0, -127.5, 1.0]
        check(x, name, "float32", int_range="full")


def test_one_dimensional_and_long_tensors() -> None:
    check(hostile((32 * 300,), 32, seed=1), "mxfp4", "float32")
    check(hostile((2, 16 * 700), 16, seed=2), "mx6", "bfloat16")


def test_the_general_kernel_agrees_with_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # The switch that turns the fast path off must reach the general kernel, bit for bit.
    x = to_torch(hostile((8, 128), 32, seed=4), "bfloat16")
    fast = cast(x, "mxfp6e2", mode="compress", backend="triton")
    monkeypatch.setenv("ONNXQ_TRITON_FAST", "0")
    assert tf.fast_plan((8, 128), datatype("mxfp6e2"), 1, RoundMode.EVEN) is None
    slow = cast(x, "mxfp6e2", mode="compress", backend="triton")
    for field in ("data", "scale", "meta"):
        assert_same(getattr(fast, field), getattr(slow, field), field)


# Every packing layout a compress cast can use, per code width: the smallest whole-byte group
# from the flattened block and from a 3-D block, and larger groups written as 16/32/64-bit
# integers (which unit and how many: `tf._units`; nvfp4's 32 is clamped to its 16-code tile).
PACK_GROUPS = {
    "nvfp4": ("flat", "3d", "load", "1", "8", "16", "32"),  # 4-bit: 16 codes, one 64-bit store
    "mxfp4": ("flat", "3d", "load", "16", "32"),  # 32 codes: two 64-bit halves
    "mxfp6e2": ("flat", "3d", "load", "8", "16"),  # 6-bit: 8 codes 3 x 16 bits, 16 3 x 32
    "mx6": ("flat", "3d", "load", "16"),  # 5-bit codes and MX shift bits: 16 are 5 x 16 bits
    "mx4": ("flat", "3d", "load", "16"),  # 3-bit: 16 codes are 3 x 16 bits
}


@pytest.mark.parametrize("name", sorted(PACK_GROUPS))
def test_every_packing_group_writes_the_same_stream(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # Each group size must write packing.py's stream bit for bit; 6 rows of 192 end the
    # last program's block inside the tensor, so the stores past the end are masked.
    x = hostile((6, 192), 16, seed=8)
    for group in PACK_GROUPS[name]:
        monkeypatch.setenv("ONNXQ_TRITON_PACK_GROUP", group)
        check(x, name, "float32", modes=("compress",))
    for group in ("load", "16"):  # 8 codes of a bfloat16 load; 16 codes over two threads
        monkeypatch.setenv("ONNXQ_TRITON_PACK_GROUP", group)
        check(x, name, "bfloat16", modes=("compress",))


@pytest.mark.parametrize("name", ["e2m2_e4m3_t4", "e2m3_e4m3_t2", "e1m1_e4m3_t2"])
def test_tiles_shorter_than_a_packing_group(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    # 5-, 6- and 3-bit codes with a float scale in tiles of 4 or 2: the smallest whole-byte
    # group (8, 4, 8 codes) spans tiles, so no 3-D block (it used to fail to compile), and
    # larger groups fall back to it; 5 rows of 24 codes end the stream inside a byte group.
    rng = np.random.default_rng(12)
    x = rng.standard_normal((5, 24)).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-30, 30, size=x.shape).astype(np.float32)
    x[0, :4] = [0.0, -0.0, np.inf, np.nan]
    for group in ("", "3d", "load", "16"):
        monkeypatch.setenv("ONNXQ_TRITON_PACK_GROUP", group)
        check(x, name, "float32", modes=("compress",))


@pytest.mark.parametrize("name", ["e4m3fn_e4m3fn_t4", "e5m2_e4m3fn_t2", "nvfp4"])
def test_zero_float_scales_give_positive_zeros(name: str) -> None:
    # A float scale of zero (a tile of +-0, or amax / 57344 below E4M3's smallest step for
    # E5M2 elements) sends every element but NaN to +0 in the reference, -0 and -Inf included;
    # the fast path kept the input's sign where the element format has a -0.
    tile = datatype(name).sspec.tiles[0].size
    x = np.zeros((4, 2 * tile), np.float32)
    x[0] = -0.0
    x[1, :2] = [-1.0, 2.0]  # E5M2 / E4M3: a scale under the smallest step
    x[2, :3] = [-np.inf, np.nan, -0.0]
    x[3] = np.linspace(-3.0, 3.0, 2 * tile)
    check(x, name, "float32")
    check(x, name, "bfloat16", modes=("virtual",))


def test_pack_group_units() -> None:
    # (unit bits, units) of a group: the largest power of two up to 64 dividing its bits.
    assert tf._units(4, 2) == (8, 1)  # 8 bits: a byte
    assert tf._units(6, 4) == (8, 3)  # 24 bits: three bytes
    assert tf._units(6, 16) == (32, 3)  # 96 bits
    assert tf._units(5, 16) == (16, 5)  # 80 bits
    assert tf._units(4, 32) == (64, 2)  # 128 bits


def test_a_bad_program_size_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    x = to_torch(hostile((2, 64), 32, seed=3), "float32")
    for bad in ("4096", "512:8", "3000:8", "4096:3"):  # no warps, too small, not 2^k, warps
        monkeypatch.setenv("ONNXQ_TRITON_FAST_CONFIG", bad)
        with pytest.raises(ValueError, match=r"ONNXQ_TRITON_FAST_CONFIG=.*e\.g\. 4096:8"):
            cast(x, "mxfp4", backend="triton")


def test_a_bad_pack_group_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    x = to_torch(hostile((2, 64), 32, seed=3), "float32")
    for bad in ("12", "-4", "0", "64", "3D"):  # not a power of two, <= 0, 384 bits, a typo
        monkeypatch.setenv("ONNXQ_TRITON_PACK_GROUP", bad)
        with pytest.raises(ValueError, match="ONNXQ_TRITON_PACK_GROUP"):
            cast(x, "mxfp6e2", mode="compress", backend="triton")


@pytest.mark.parametrize(
    ("shape", "axis", "kw", "why"),
    [
        ((4, 100), 1, {}, "tile length"),
        ((40, 4), 0, {}, "dividing the tiled axis"),
        ((4, 64), 1, {"round_mode": "stochastic"}, "round modes"),
        ((4, 64), 1, {"dtype": "uint4_block32"}, "zero points"),
    ],
)
def test_what_the_fast_path_leaves_to_the_general_kernel(shape, axis, kw, why) -> None:
    dt = datatype(kw.get("dtype", "mxfp4"))
    rmode = RoundMode.parse(kw.get("round_mode", "even"))
    reason = tf.why_not_fast(shape, dt, axis, rmode)
    assert reason is not None and why in reason


def test_tensor_amax_pass_with_several_blocks_per_program(monkeypatch: pytest.MonkeyPatch) -> None:
    # NVFP4's tensor scale comes from one strided reduction pass; with two programs, each
    # takes several blocks and the last rounds fall past the end of the tensor.
    monkeypatch.setattr(tf, "_AMAX_PROGRAMS", 2)
    x = hostile((5, 4096 + 16 * 3), 16, seed=21)  # 5 rows: a little over 5 blocks of 4096
    x[4, -1] = 3.0e6  # the largest finite value sits in the last block
    check(x, "nvfp4", "float32", modes=("virtual", "compress"))
    check(x, "nvfp4", "bfloat16", modes=("virtual",))


@pytest.mark.parametrize(
    "name",
    ["uint4_block32", "int8_e8m0_t16n2m4", "e4m3fn_e8m0_t4n2m4_t8", "cb41fi_e2m2fnuz_e8m0_t32"],
)
def test_every_engine_through_onnxq_cast(name: str) -> None:
    # Zero points, N:M masks, 2-D tiles and codebooks leave the fast path: onnxq.cast and
    # onnxq.upcast must route them to the engine that has them and carry every field.
    x = hostile((8, 64), 32, seed=17)
    dt = datatype(name)
    assert tf.why_not_fast(x.shape, dt, 1, RoundMode.EVEN) is not None
    xt = to_torch(x, "float32")
    for mode in ("virtual", "actual", "compress"):
        want = cast(x, name, mode=mode, backend="reference")
        got = cast(xt, name, mode=mode, backend="triton")
        if mode == "virtual":
            assert_same(got, want, f"{name} virtual")
            continue
        assert_same_qtensor(got, want, f"{name} {mode}")
        assert_same(onnxq.upcast(got), upcast(want), f"{name} {mode} upcast")
