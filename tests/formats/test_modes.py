"""Modes: the closed choices of the cast contract and the `defaults` context manager.

The valid values come from the modes document (round, scale, cast modes) and docs/architecture.md,
decisions 3 (rceil, even scale modes), 5 (nan_policy), 12 (backends) and 13 (defaults).
"""

from __future__ import annotations

import pytest

import onnxq.formats as formats
from onnxq.formats import Backend, CastMode, NanPolicy, RoundMode, ScaleMode
from onnxq.formats.modes import current_defaults, defaults

# (enum, the values the documents name)
DOCUMENTED = (
    (RoundMode, ("even", "away", "zero", "stochastic")),  # modes document "Rounding Mode"
    # modes document "Scale Selection Mode" (five methods) + decision 3 (rceil, even) + the
    # per-tile search for stored weights (docs/formats.md, "Scale modes")
    (ScaleMode, ("floor", "ceil", "midmax", "option3", "topbinade", "rceil", "even", "search")),
    (CastMode, ("virtual", "actual", "compress")),  # modes document "Cast Mode"
    (NanPolicy, ("element", "block")),  # architecture decision 5
    (Backend, ("auto", "reference", "native", "triton")),  # architecture decision 12
)
CASES = [(enum, value) for enum, values in DOCUMENTED for value in values]


def _case_id(case: tuple[type, str]) -> str:
    return f"{case[0].__name__}-{case[1]}"


@pytest.mark.parametrize(("enum", "values"), DOCUMENTED, ids=[d[0].__name__ for d in DOCUMENTED])
def test_each_enum_has_exactly_the_documented_values(enum: type, values: tuple[str, ...]) -> None:
    assert sorted(m.value for m in enum) == sorted(values)


@pytest.mark.parametrize(("enum", "value"), CASES, ids=[_case_id(c) for c in CASES])
def test_each_value_parses_case_insensitively(enum: type, value: str) -> None:
    member = enum.parse(value)
    assert member.value == value
    assert enum.parse(value.upper()) is member
    assert enum.parse(value.title()) is member
    assert enum.parse(member) is member
    assert member == value  # string-valued enum


@pytest.mark.parametrize(("enum", "values"), DOCUMENTED, ids=[d[0].__name__ for d in DOCUMENTED])
def test_an_unknown_value_raises_listing_the_valid_ones(
    enum: type, values: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError, match="'nearest'") as info:
        enum.parse("nearest")
    for value in values:
        assert repr(value) in str(info.value)


@pytest.mark.parametrize(
    "enum", [d[0] for d in DOCUMENTED], ids=[d[0].__name__ for d in DOCUMENTED]
)
def test_a_member_of_another_enum_is_not_accepted(enum: type) -> None:
    other = NanPolicy.BLOCK if enum is not NanPolicy else CastMode.COMPRESS
    with pytest.raises(ValueError, match=other.value):
        enum.parse(other)


# -- defaults ------------------------------------------------------------------------------------
def test_the_documented_defaults_are_in_force_outside_any_block() -> None:
    d = current_defaults()
    assert d.round_mode is RoundMode.EVEN  # modes document: "The default mode, even"
    assert d.scale_mode is ScaleMode.FLOOR  # architecture decision 3: floor is the default (OCP)
    assert d.nan_policy is NanPolicy.ELEMENT  # architecture decision 5: element is the default


def test_defaults_sets_values_inside_the_block_and_restores_them_after() -> None:
    before = current_defaults()
    with defaults(round_mode="STOCHASTIC", seed=7, scale_mode="midmax") as d:
        assert d is current_defaults()
        assert d.round_mode is RoundMode.STOCHASTIC
        assert d.scale_mode is ScaleMode.MIDMAX
        assert d.seed == 7
        assert d.nan_policy is before.nan_policy  # untouched keys keep their values
    assert current_defaults() == before


def test_defaults_restores_the_previous_values_when_the_block_raises() -> None:
    before = current_defaults()

    class BoomError(Exception):
        pass

    with pytest.raises(BoomError), defaults(round_mode="away", nan_policy="block"):
        assert current_defaults().round_mode is RoundMode.AWAY
        raise BoomError
    assert current_defaults() == before


def test_nested_defaults_restore_each_level() -> None:
    before = current_defaults()
    with defaults(round_mode="zero"):
        with defaults(backend="reference", mode="actual"):
            assert current_defaults().round_mode is RoundMode.ZERO
            assert current_defaults().backend is Backend.REFERENCE
            assert current_defaults().mode is CastMode.ACTUAL
        assert current_defaults().backend is before.backend
        assert current_defaults().round_mode is RoundMode.ZERO
    assert current_defaults() == before


def test_an_unknown_default_key_raises_naming_it() -> None:
    before = current_defaults()
    with pytest.raises(ValueError, match="'rounding'"), defaults(rounding="even"):
        pytest.fail("the block must not run")
    assert current_defaults() == before


def test_an_unknown_default_value_raises_naming_it() -> None:
    before = current_defaults()
    with pytest.raises(ValueError, match=r"round_mode 'nearest'"), defaults(round_mode="nearest"):
        pytest.fail("the block must not run")
    assert current_defaults() == before


def test_the_package_exports_the_same_defaults() -> None:
    assert formats.defaults is defaults
    assert formats.current_defaults is current_defaults
    before = formats.current_defaults().seed
    with formats.defaults(seed=before + 3):
        assert formats.current_defaults().seed == before + 3
    assert formats.current_defaults().seed == before
