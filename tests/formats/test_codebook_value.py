"""A Codebook is an immutable value: its mappings take part in equality, hash and caches."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from onnxq.cast.elements import _table
from onnxq.formats.codebook import Codebook

# cb31_e2m3fnuz: 3-bit indices (4 magnitudes, then the sign-1 half), 2 mappings; e2m3fnuz has
# no -0, so index 4 (sign 1, magnitude 0) is +0.0.
FIRST = ((0.0, 1.0, 2.0, 4.0), (0.0, 0.5, 3.0, 7.5))
SECOND = ((0.0, 0.5, 3.0, 7.5), (0.0, 1.0, 2.0, 4.0))  # the same two, swapped


def _book(mappings: tuple[tuple[float, ...], ...]) -> Codebook:
    return Codebook.parse("cb31_e2m3fnuz").add_mappings(mappings)


def test_codebooks_differing_only_in_mappings_are_unequal() -> None:
    a, b = _book(FIRST), _book(SECOND)
    assert a.name == b.name
    assert a != b
    assert a == _book(FIRST) and hash(a) == hash(_book(FIRST))
    assert len({a, b, _book(FIRST)}) == 2


def test_the_decode_cache_returns_each_codebooks_own_table() -> None:
    # _table decodes every index with mapping 0 (Codebook.decode's default meta).
    want_first = [0.0, 1.0, 2.0, 4.0, 0.0, -1.0, -2.0, -4.0]
    want_second = [0.0, 0.5, 3.0, 7.5, 0.0, -0.5, -3.0, -7.5]
    np.testing.assert_array_equal(_table(_book(FIRST)), want_first)
    np.testing.assert_array_equal(_table(_book(SECOND)), want_second)
    np.testing.assert_array_equal(_table(_book(FIRST)), want_first)  # a cache hit stays right


def test_a_codebook_cannot_be_changed_in_place() -> None:
    empty = Codebook.parse("cb31_e2m3fnuz")
    full = empty.add_mappings(FIRST)
    assert empty.mappings == () and not empty.is_populated
    assert full.mappings == FIRST and isinstance(full.mappings, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        full.mappings = SECOND  # type: ignore[misc]
