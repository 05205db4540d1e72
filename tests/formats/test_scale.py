"""ScaleSpec / TileSpec: the scaling document's two example tables and the grammar.

Expected number specs are built field by field (not parsed), so a parser mistake cannot hide
behind itself. Tile sizes, subtiles and N:M come from the tables' dim -2 / dim -1 columns.
"""

from __future__ import annotations

import dataclasses

import pytest

from onnxq.formats import InfNaN, Kind, NumberSpec, ScaleSpec, TileSpec, scale

# Scale number types, from their field layouts
FP32 = NumberSpec(kind=Kind.FLOAT, ebits=8, mbits=23, bias=127, infnan=InfNaN.IEEE)  # binary32
FP16 = NumberSpec(kind=Kind.FLOAT, ebits=5, mbits=10, bias=15, infnan=InfNaN.IEEE)  # binary16
BF16 = NumberSpec(kind=Kind.FLOAT, ebits=8, mbits=7, bias=127, infnan=InfNaN.IEEE)
E8M0 = NumberSpec(kind=Kind.EXPONENT, ebits=8, mbits=0, bias=127)  # OCP E8M0
E4M3FN = NumberSpec(kind=Kind.FLOAT, ebits=4, mbits=3, bias=7, infnan=InfNaN.FN)  # OCP E4M3
INT8 = NumberSpec(kind=Kind.INT, ebits=0, mbits=7, bias=0)  # sign + 7 magnitude bits

CHANNEL = TileSpec(size=0)


@dataclasses.dataclass(frozen=True)
class Row:
    """One example of the scaling document and what the document says it means."""

    code: str
    data: str | None  # the data column; None for the implicit codebook row
    scale: NumberSpec
    zero: NumberSpec | None
    tenscale: NumberSpec | None
    tiles: tuple[TileSpec, ...]
    subtile: tuple[int, int] = (0, 0)
    sparsity: tuple[int, int, int] = (0, 0, -1)


ROWS = (
    # "float32 | tensor scaled, fp32 scale, either fp or int data (not uint)": no tile segment
    Row("float32", "e4m3fn", FP32, None, None, ()),
    Row("float32", "int8", FP32, None, None, ()),
    # "float32_t0 | channel scaled in last dim, fp32 scale, fp or int data"
    Row("float32_t0", "e4m3fn", FP32, None, None, (CHANNEL,)),
    Row("float32_t0", "int8", FP32, None, None, (CHANNEL,)),
    # "e8m0_t32 | with nspec e3m2fnuz, makes MXFP6E3 OCP, tile 32 in last dim"
    Row("e8m0_t32", "e3m2fnuz", E8M0, None, None, (TileSpec(size=32),)),
    # "float16_int8_t16n2m4 | asymmetric (uint) data, fp16 scale, int8 zero point, 2:4 sparsity
    # and 1x16 tile"; second table: data uint ("sparse uint4 tile 16"), dim -1 "t16 2:4"
    Row(
        "float16_int8_t16n2m4",
        "uint4",
        FP16,
        INT8,
        None,
        (TileSpec(size=16, sparse_n=2, sparse_m=4),),
        sparsity=(2, 4, 0),
    ),
    # "e8m0_t16s4_t16s4 (typo'd e8m0_t16m4_t16s4 in the first table, architecture decision 8) |
    # implicit codebook, exponent scale on 16x16 tile, codebook selection on 4x4 subtile";
    # second table: data icb, scale e8m0, dim -2 "t16 s4", dim -1 "t16 s4"
    Row(
        "e8m0_t16s4_t16s4",
        None,
        E8M0,
        None,
        None,
        (TileSpec(size=16, subtile=4), TileSpec(size=16, subtile=4)),
        subtile=(4, 4),
    ),
    # "bfloat16_bfloat16_t0_t32 | asymmetric (uint) data, bf16 scale and zero point, channelx32
    # tile"; second table: dim -2 channel, dim -1 t32
    Row("bfloat16_bfloat16_t0_t32", "uint4", BF16, BF16, None, (CHANNEL, TileSpec(size=32))),
    # "e4m3_float32_t16_t16 | with e4m3fn data ... fp32 tensor scale on fp7 16x16 tile";
    # second table: data e4m3fn, scale e4m3fn, tenscale fp32, dim -2 t16, dim -1 t16
    Row(
        "e4m3_float32_t16_t16", "e4m3fn", E4M3FN, None, FP32, (TileSpec(size=16), TileSpec(size=16))
    ),
)


def _row_id(row: Row) -> str:
    return f"{row.code}-{row.data}"


@pytest.mark.parametrize("row", ROWS, ids=[_row_id(r) for r in ROWS])
def test_each_example_of_the_scaling_document_parses_as_the_document_says(row: Row) -> None:
    s = scale(row.code, data=row.data)
    assert s.scale == row.scale
    assert s.zero == row.zero
    assert s.tenscale == row.tenscale
    assert s.tiles == row.tiles
    assert s.subtile == row.subtile
    assert s.sparsity == row.sparsity


@pytest.mark.parametrize("row", ROWS, ids=[_row_id(r) for r in ROWS])
def test_the_scope_properties_follow_the_tiles(row: Row) -> None:
    s = scale(row.code, data=row.data)
    assert s.is_tensor == (not row.tiles)
    assert s.is_2d == (len(row.tiles) == 2)
    # The scaling document: "is_multiscale is True" when a tensor scale is combined with another
    # scope
    assert s.is_multiscale == (row.tenscale is not None)
    assert [t.is_channel for t in s.tiles] == [t.size == 0 for t in row.tiles]
    assert [t.is_sparse for t in s.tiles] == [t.sparse_m > 0 for t in row.tiles]


@pytest.mark.parametrize("row", ROWS, ids=[_row_id(r) for r in ROWS])
def test_the_parse_method_agrees_with_the_scale_function(row: Row) -> None:
    assert ScaleSpec.parse(row.code, row.data) == scale(row.code, data=row.data)


@pytest.mark.parametrize("row", ROWS, ids=[_row_id(r) for r in ROWS])
def test_the_canonical_code_parses_back_to_the_same_spec(row: Row) -> None:
    s = scale(row.code, data=row.data)
    assert scale(str(s), data=row.data) == s
    assert scale(s.name.upper(), data=row.data) == s


def test_a_second_number_code_is_a_zero_point_for_uint_data_else_a_tensor_scale() -> None:
    # Architecture decision 8: two number codes = (scale, zero) when the data is uint, else
    # (scale, tenscale)
    as_uint = scale("bfloat16_bfloat16_t0_t32", data="uint8")
    assert (as_uint.zero, as_uint.tenscale) == (BF16, None)
    as_float = scale("bfloat16_bfloat16_t0_t32", data="e4m3fn")
    assert (as_float.zero, as_float.tenscale) == (None, BF16)
    # three number codes = (scale, zero, tensor scale)
    three = scale("float16_int8_float32_t32", data="uint4")
    assert (three.scale, three.zero, three.tenscale) == (FP16, INT8, FP32)


@pytest.mark.parametrize(
    ("short", "full"), [("float32_t", "float32_t0"), ("e8m0_t_t32", "e8m0_t0_t32")]
)
def test_t_and_t0_both_mean_a_channel_tile(short: str, full: str) -> None:
    # The scaling document: 'Both "t" and "t0" can be used to specify channel scaled dimension.'
    assert scale(short) == scale(full)
    assert str(scale(short)) == full


@pytest.mark.parametrize(
    ("code", "tile"),
    [
        ("t32", TileSpec(size=32)),
        ("t0", CHANNEL),
        ("t", CHANNEL),
        ("t16s2", TileSpec(size=16, subtile=2)),
        ("t16n2m4", TileSpec(size=16, sparse_n=2, sparse_m=4)),
        ("t32s4n1m2", TileSpec(size=32, subtile=4, sparse_n=1, sparse_m=2)),
        ("t0n2m4", TileSpec(size=0, sparse_n=2, sparse_m=4)),
    ],
)
def test_a_tile_code_parses_to_its_fields_and_back(code: str, tile: TileSpec) -> None:
    assert TileSpec.parse(code) == tile
    assert TileSpec.parse(tile.name) == tile


# -- malformed scale codes -----------------------------------------------------------------------
MALFORMED = (
    # Architecture decision 8: the first table's typo; the message suggests the fix
    ("e8m0_t16m4_t16s4", r"t16m4.*did you mean 't16s4'"),
    ("t3", r"tile size 3 .*power of two"),
    ("e8m0_t3", r"tile size 3 .*power of two"),
    ("e8m0_t1", r"tile size 1 .*power of two"),
    ("e8m0_tx", r"bad tile 'tx'"),
    ("e8m0_e8m0", r"tensor scale must be a float.*e8m0"),  # a second e8m0 is no tensor scale
    ("e8m0_t32_t32_t32", r"at most two tile"),
    ("e8m0_t0_t0", r"at most one channel"),
    ("e8m0_t16s16", r"subtile 16 .*smaller than the tile 16"),
    ("e8m0_t16s3", r"subtile 3 .*power of two"),
    ("e8m0_t0s2", r"t0s2.*channel tile"),
    ("e8m0_t16n4m4", r"N=4 .*1 <= N < M=4"),
    ("e8m0_t16n0m4", r"N=0 .*1 <= N < M=4"),
    ("e8m0_t16n2m3", r"M=3 .*2, 4, 8 or 16"),
    ("e8m0_t8n2m16", r"M=16 does not divide tile 8"),
    ("float32_t16n2m4_t16n2m4", r"sparsity on at most one"),
    # scale() names the empty segment '', ScaleSpec.parse calls it an empty segment
    ("e8m0__t32", r"e8m0__t32.*(''|empty segment)"),
    ("e8m0_t32_e8m0", r"'e8m0' after a tile"),
    ("int8_t32", r"scale must be a float or exponent.*int8"),
    ("e8m0_float32_uint8_int8_t32", r"at most three number codes"),
    ("t32", r"starts with the scale's number code"),
    ("floaty_t32", r"segment 'floaty'"),
    ("float32_float32", r"tensor scale on top of a tensor scale needs tiles"),
    ("e8m0_float32_t32", r"tensor scale on top of exponent"),
    ("", r"''"),
)


@pytest.mark.parametrize(("code", "message"), MALFORMED, ids=[m[0] or "empty" for m in MALFORMED])
def test_a_malformed_scale_code_raises_naming_the_bad_part(code: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        scale(code)
    with pytest.raises(ValueError, match=message):
        ScaleSpec.parse(code)


@pytest.mark.parametrize("code", [32, None, b"e8m0_t32"])
def test_a_scale_code_that_is_not_a_string_raises_type_error(code: object) -> None:
    with pytest.raises(TypeError, match=type(code).__name__):
        scale(code)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=type(code).__name__):
        ScaleSpec.parse(code)  # type: ignore[arg-type]


def test_a_bad_data_code_is_reported_as_a_number_code() -> None:
    with pytest.raises(ValueError, match="'uint0'"):
        scale("float32_t32", data="uint0")
