"""DataType: presets, codes, bits per value, the registry and the errors of the data type language.

Every preset's code and bits per value is worked by hand from the documents (OCP MX v1.0 as
cited by the scaling document, the MX9/MX6/MX4 and BFP documents, docs/architecture.md
decisions 8-11).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re

import pytest

from onnxq.formats import (
    DataType,
    InfNaN,
    Kind,
    NumberSpec,
    TileSpec,
    datatype,
    datatypes,
    number,
    register,
    scale,
)


@dataclasses.dataclass(frozen=True)
class Preset:
    """A preset name, its element and scale codes written by hand, and its bits per value."""

    name: str
    nspec: str
    sspec: str
    bits_per_value: float


PRESETS = (
    # OCP MX v1.0: E8M0 scale (8 bits) shared by a block of 32 -> element bits + 8/32
    Preset("mxfp8e5", "e5m2", "e8m0_t32", 8 + 8 / 32),  # 8.25
    Preset("mxfp8e4", "e4m3fn", "e8m0_t32", 8 + 8 / 32),  # 8.25
    # scaling document: "e8m0_t32 | with nspec e3m2fnuz, makes MXFP6E3 OCP, tile 32 in last dim"
    Preset("mxfp6e3", "e3m2fnuz", "e8m0_t32", 6 + 8 / 32),  # 6.25
    Preset("mxfp6e2", "e2m3fnuz", "e8m0_t32", 6 + 8 / 32),  # 6.25
    Preset("mxfp4e2", "e2m1fnuz", "e8m0_t32", 4 + 8 / 32),  # 4.25
    Preset("mxfp4", "e2m1fnuz", "e8m0_t32", 4 + 8 / 32),  # OCP has one FP4: E2M1
    Preset("mxint8", "int8", "e8m0_t32", 8 + 8 / 32),  # 8.25
    Preset("mxint4", "int4", "e8m0_t32", 4 + 8 / 32),  # 4.25
    # BFP document: bfp16 = block 16, 8-bit mantissa (sign included); 8-bit shared exponent
    Preset("bfp16", "int8", "e8m0_t16", 8 + 8 / 16),  # 8.5
    # BFP document: bfp8 = block 32, 4-bit mantissa
    Preset("bfp8", "int4", "e8m0_t32", 4 + 8 / 32),  # 4.25
    # MX9/MX6/MX4 document: (m + 1) + d1/k1 + d2/k2 with d1 = 8, k1 = 16, d2 = 1, k2 = 2;
    # m = 7, 4, 2 for MX9, MX6, MX4 (architecture decision 10); the 1-bit shift is the s2 subtile
    Preset("mx9", "int8", "e8m0_t16s2", (7 + 1) + 8 / 16 + 1 / 2),  # 9
    Preset("mx6", "int5", "e8m0_t16s2", (4 + 1) + 8 / 16 + 1 / 2),  # 6
    Preset("mx4", "int3", "e8m0_t16s2", (2 + 1) + 8 / 16 + 1 / 2),  # 4
    # NVFP4: E2M1 elements, an E4M3 scale per 16, one FP32 tensor scale (amortised to 0)
    Preset("nvfp4", "e2m1fnuz", "e4m3fn_float32_t16", 4 + 8 / 16),  # 4.5
    # tensor / channel scales are one number for the whole tensor / axis: 0 bits per value
    Preset("int8_tensor", "int8", "float32", 8),
    Preset("int8_channel", "int8", "float32_t0", 8),
    Preset("int4_channel", "int4", "float32_t0", 4),
    Preset("uint8_tensor", "uint8", "float32_uint8", 8),  # uint needs a zero point
    Preset("uint8_channel", "uint8", "float32_uint8_t0", 8),
    # fp16 scale + uint8 zero point per block of 32: 4 + 16/32 + 8/32 = 4.75
    Preset("uint4_block32", "uint4", "float16_uint8_t32", 4 + 16 / 32 + 8 / 32),
    Preset("fp8e4_tensor", "e4m3fn", "float32", 8),
    Preset("fp8e4_channel", "e4m3fn", "float32_t0", 8),
    Preset("fp8e5_tensor", "e5m2", "float32", 8),
)

# Names the documents leave to a choice between two OCP variants: the preset must be one of them.
DEFAULT_VARIANTS = {
    "mxfp8": ("mxfp8e4", "mxfp8e5"),
    "mxfp6": ("mxfp6e2", "mxfp6e3"),
}


@pytest.mark.parametrize("p", PRESETS, ids=[p.name for p in PRESETS])
def test_each_preset_is_its_element_and_scale(p: Preset) -> None:
    dt = datatype(p.name)
    assert dt == datatype(p.nspec, p.sspec)
    assert dt == datatype(f"{p.nspec}_{p.sspec}")
    assert dt.nspec == number(p.nspec)
    assert dt.sspec == scale(p.sspec, data=p.nspec)


@pytest.mark.parametrize("p", PRESETS, ids=[p.name for p in PRESETS])
def test_each_preset_has_the_hand_worked_bits_per_value(p: Preset) -> None:
    assert datatype(p.name).bits_per_value == p.bits_per_value


@pytest.mark.parametrize("p", PRESETS, ids=[p.name for p in PRESETS])
def test_each_preset_keeps_its_name_and_its_code_round_trips(p: Preset) -> None:
    dt = datatype(p.name)
    assert dt.name == p.name
    assert str(dt) == p.name
    assert datatype(dt.code) == dt
    assert datatype(p.name.upper()) == dt


@pytest.mark.parametrize(("name", "variants"), DEFAULT_VARIANTS.items())
def test_an_unqualified_preset_is_one_of_its_ocp_variants(
    name: str, variants: tuple[str, ...]
) -> None:
    dt = datatype(name)
    assert any(dt == datatype(v) for v in variants)
    assert dt.bits_per_value == datatype(variants[0]).bits_per_value


def test_datatypes_lists_every_preset_of_the_issue() -> None:
    listed = datatypes()
    expected = {p.name for p in PRESETS} | set(DEFAULT_VARIANTS)
    assert expected <= set(listed)
    for name, dt in listed.items():
        assert dt.name == name
        assert dt.bits_per_value > 0


@pytest.mark.parametrize(
    ("code", "bits_per_value"),
    [
        # e4m3fn data, e4m3fn scale per 16x16 tile, fp32 tensor scale: 8 + 8/256
        ("e4m3fn_e4m3fn_float32_t16_t16", 8 + 8 / 256),
        # unscaled: just the element bits
        ("bfloat16", 16),
        ("e4m3fn", 8),
        # a channel x 32 tile has one scale per 32 columns of a whole axis: amortised to 0
        ("int8_float32_t0_t32", 8),
        # 2-D e8m0 tile 8x4: 4 + 8/32
        ("e2m1_e8m0_t8_t4", 4 + 8 / 32),
    ],
)
def test_bits_per_value_of_other_codes(code: str, bits_per_value: float) -> None:
    assert datatype(code).bits_per_value == bits_per_value


def test_bits_per_value_of_a_sparse_tile_counts_everything_per_element() -> None:
    # uint4 data, fp16 scale, int8 zero, 1x16 tile with 2:4 sparsity (scaling document table row).
    # One tile = 16 tensor elements: 8 kept x 4 bits = 32, mask 16 x 1 bit = 16, scale 16,
    # zero 8 -> 72 bits / 16 elements = 4.5. (onnxq counts T in element positions, kept or
    # pruned; counting kept values instead would give (16 x 4 + 32 + 16 + 8) / 32 = 3.75.)
    assert datatype("uint4_float16_int8_t16n2m4").bits_per_value == 4.5


def test_a_codebook_data_type_parses_to_a_codebook_and_its_scale() -> None:
    if importlib.util.find_spec("onnxq.formats.codebook") is None:
        pytest.skip("onnxq/formats/codebook.py is not written yet")
    from onnxq.formats import Codebook

    dt = datatype("cb41fi_e2m2fnuz_e8m0_t32")
    assert isinstance(dt.nspec, Codebook)
    assert dt.nspec.is_codebook
    assert dt.nspec.bits == 4  # cb<4 index bits><1 meta bit>
    # the compute type is e2m2fnuz and the scale is OCP E8M0 over 32 in the last dim
    assert dt.sspec is not None
    assert dt.sspec.scale == NumberSpec(kind=Kind.EXPONENT, ebits=8, mbits=0, bias=127)
    assert dt.sspec.tiles == (TileSpec(size=32),)
    assert dt.sspec == scale("e8m0_t32")
    assert datatype(dt.code) == dt
    # 4 index bits + 8/32 scale + 1 meta bit (the mapping chosen per tile of 32) / 32
    assert dt.bits_per_value == 4 + 8 / 32 + 1 / 32


def test_a_preset_built_from_parts_equals_the_preset_ignoring_the_name() -> None:
    built = datatype(
        NumberSpec(kind=Kind.FLOAT, ebits=2, mbits=1, bias=1, infnan=InfNaN.FNUZ),
        scale("e8m0_t32"),
    )
    assert built == datatype("mxfp4")
    assert built.name == "e2m1fnuz_e8m0_t32"  # no preset name when built from parts
    assert isinstance(built, DataType)


# -- the registry --------------------------------------------------------------------------------
# `onnxq.formats.datatype` the attribute is the function; the module comes from the import system.
datatype_module = importlib.import_module("onnxq.formats.datatype")


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> dict[str, DataType]:
    """A private copy of the preset registry, restored after the test."""
    copy = dict(datatype_module._PRESETS)
    monkeypatch.setattr(datatype_module, "_PRESETS", copy)
    return copy


def test_registering_an_existing_name_with_the_same_meaning_is_a_no_op(
    registry: dict[str, DataType],
) -> None:
    before = dict(registry)
    again = register("mxfp4", "e2m1_e8m0_t32")  # bare e2m1 is e2m1fnuz
    assert again == before["mxfp4"]
    assert again.name == "mxfp4"
    assert register("MXFP4", datatype("e2m1fnuz", "e8m0_t32")) == before["mxfp4"]
    assert registry == before


def test_registering_an_existing_name_with_a_different_meaning_raises(
    registry: dict[str, DataType],
) -> None:
    before = dict(registry)
    with pytest.raises(ValueError, match=r"'mxfp4'.*e2m1fnuz_e8m0_t32.*e3m2fnuz_e8m0_t32"):
        register("mxfp4", "e3m2_e8m0_t32")
    assert registry == before
    assert datatype("mxfp4").nspec == number("e2m1")


def test_a_registered_name_becomes_a_preset(registry: dict[str, DataType]) -> None:
    dt = register("my_fp6", "e3m2fnuz_e8m0_t16")
    assert dt.name == "my_fp6"
    assert datatype("my_fp6") == datatype("e3m2fnuz", "e8m0_t16")
    assert "my_fp6" in datatypes()
    assert datatype("my_fp6").bits_per_value == 6 + 8 / 16


@pytest.mark.parametrize("name", ["1fp4", "my fp4", "fp4!", ""])
def test_a_preset_name_that_is_not_an_identifier_raises(
    registry: dict[str, DataType], name: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(name))):
        register(name, "e2m1_e8m0_t32")


def test_the_registry_fixture_leaves_no_trace() -> None:
    assert "my_fp6" not in datatypes()


# -- malformed data types ------------------------------------------------------------------------
MALFORMED = (
    ("int8", r"'int8'.*only float formats can be unscaled"),
    ("uint4", r"'uint4'.*only float formats can be unscaled"),
    ("uint8_e8m0_t32", r"uint8_e8m0_t32.*needs a zero point"),
    # the data is not uint, so a second number code is a tensor scale, and uint8 is no float
    ("e4m3fn_float32_uint8", r"float32_uint8.*uint8"),
    ("e2m1_e8m0_float32_t16", r"tensor scale on top of exponent"),
    ("e8m0_e8m0_t32", r"exponent type \(e8m0\) is a scale"),
    ("e4m3fn_e8m0_t16s2", r"e4m3fn_e8m0_t16s2.*subtile"),
    ("uint8_e8m0_uint8_t32", r"zero points need a float scale"),
    ("uint8_float16_int8_t32", r"zero point int8 cannot hold every uint8 code"),
    ("int8_t32_e8m0", r"'e8m0' after a tile"),
    ("e5m2_e8m0_t0s2", r"t0s2.*channel tile"),
    ("e2m1_float32_float32", r"tensor scale on top of a tensor scale needs tiles"),
    ("e8m0_t16m4_t16s4", r"did you mean 't16s4'"),
    ("mxfp5", r"'mxfp5' is neither a preset"),
    ("floaty_e8m0_t32", r"'floaty'"),
    ("", r"''"),
)


@pytest.mark.parametrize(("code", "message"), MALFORMED, ids=[m[0] or "empty" for m in MALFORMED])
def test_a_malformed_data_type_raises_naming_the_bad_part(code: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        datatype(code)


def test_a_zero_point_on_non_uint_data_from_parts_raises() -> None:
    # built from a scale spec parsed without data, the uint8 is a zero point
    with pytest.raises(ValueError, match=r"zero point is only for uint data, not e4m3fn"):
        datatype("e4m3fn", scale("float32_uint8"))


def test_an_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"mxfp5.*mxfp4.*mxfp6"):
        datatype("mxfp5")


@pytest.mark.parametrize(("nspec", "sspec"), [(5, None), (None, None), ("e4m3fn", 5)])
def test_a_data_type_argument_of_the_wrong_type_raises_type_error(
    nspec: object, sspec: object
) -> None:
    with pytest.raises(TypeError):
        datatype(nspec, sspec)  # type: ignore[arg-type]
