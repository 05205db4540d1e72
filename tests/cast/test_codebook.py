"""Codebook casts: per-subtile mapping selection, user metrics, and MX6 as a codebook.

docs/architecture.md, decision 10: MX6 (int5 elements, E8M0 per 16, one shift bit per pair)
and the implicit codebook `cb51ie_e2m3_mx6` (int5 pattern and its half, chosen per 2-element
subtile) represent the same values; the preset picks the shift by the document's exponent rule,
the codebook by error. These tests show both, and where they differ.
"""

from __future__ import annotations

import numpy as np
import pytest

import onnxq

MX6_AS_CODEBOOK = "cb51ie_e2m3_mx6_e8m0_t16s2"


def test_mx6_and_its_codebook_share_one_grid_per_subtile() -> None:
    # Block max 1.5 -> maxexp 0. MX6: scale 2^(0-3) (int5 emax 3), elements k * 2^-3, k <= 15,
    # shifted pairs k * 2^-4. Codebook: scale 2^(0-2) (e2m3 emax 2), int5 pattern k/2 -> same
    # k * 2^-3, the e1 pattern k/4 -> k * 2^-4. So each pair has the same two candidate grids.
    x = np.zeros(16, np.float32)
    x[0], x[1] = 1.5, 0.3  # pair 0 holds the max: unshifted in both
    # 1.5 = 12 * 2^-3 exact; 0.3 / 2^-3 = 2.4 -> 2 -> 0.25.
    x[2], x[3] = 0.3, 0.2  # both below 2^0: MX6 shifts; 0.3/2^-4 = 4.8 -> 5 -> 0.3125,
    # 0.2/2^-4 = 3.2 -> 3 -> 0.1875 (error 0.0125^2 + 0.0125^2); unshifted would give 0.25, 0.25
    # (errors 0.05^2 + 0.05^2): the codebook also picks the shifted (half) mapping.
    mx6 = onnxq.cast(x, "mx6")
    book = onnxq.cast(x, MX6_AS_CODEBOOK)
    expected_head = np.array([1.5, 0.25, 0.3125, 0.1875], np.float32)
    assert np.array_equal(mx6[:4], expected_head)
    assert np.array_equal(book[:4], expected_head)
    q_mx6 = onnxq.cast(x, "mx6", mode="actual")
    q_book = onnxq.cast(x, MX6_AS_CODEBOOK, mode="actual")
    # meta: MX6 shift bit and codebook mapping index (mapping 1 = the halved pattern) agree.
    assert q_mx6.meta.tolist()[:2] == [0, 1]
    assert q_book.meta.tolist()[:2] == [0, 1]


def test_mx6_and_its_codebook_differ_where_the_exponent_rule_is_not_the_least_error() -> None:
    x = np.zeros(16, np.float32)
    x[0] = 1.5  # block max: maxexp 0
    x[2] = 0.99  # pair (0.99, 0): both below 2^0, so MX6 shifts: 0.99 / 2^-4 = 15.84 -> clamp
    # 15 -> 0.9375 (error 0.0525). Unshifted: 0.99 / 2^-3 = 7.92 -> 8 -> 1.0 (error 0.01), so the
    # codebook keeps mapping 0 (unshifted) while MX6's rule shifts.
    mx6 = onnxq.cast(x, "mx6")
    book = onnxq.cast(x, MX6_AS_CODEBOOK)
    assert mx6[2] == np.float32(0.9375)
    assert book[2] == np.float32(1.0)
    assert onnxq.cast(x, "mx6", mode="actual").meta[1] == 1
    assert onnxq.cast(x, MX6_AS_CODEBOOK, mode="actual").meta[1] == 0


def test_mx6_and_its_codebook_agree_on_most_random_pairs() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    mx6 = onnxq.cast(x, "mx6")
    book = onnxq.cast(x, MX6_AS_CODEBOOK)
    err_mx6 = float(np.mean((mx6 - x) ** 2))
    err_book = float(np.mean((book - x) ** 2))
    same = float(np.mean(mx6 == book))
    assert same > 0.9  # the rule and the error choice mostly coincide
    assert err_book <= err_mx6  # choosing by error never loses on total squared error


def test_a_codebook_picks_a_mapping_per_subtile() -> None:
    # cb41fi_e2m2fnuz: mapping 0 = fp4 values {0, .5, 1, 1.5, 2, 3, 4, 6}, mapping 1 = int4
    # {0, 1, ..., 7} (both at their natural place in e2m2fnuz, max 7 -> emax 2).
    # Tile of 8 with max 6 -> maxexp 2 -> scale 2^(2-2) = 1, subtiles of 4.
    x = np.array([6.0, 0.5, 1.5, 0.5, 5.0, 7.0, 6.0, 5.0], np.float32)
    # subtile 0: fp4 exact (error 0); int4: 0.5 -> 0 or 1 (tie, error .25 each), 1.5 -> tie:
    # the fp4 mapping wins. subtile 1 {5, 7, 6, 5}: tile max is 7 -> maxexp 2, same scale;
    # fp4 -> {4 or 6, 6, 6, 4 or 6}, int4 exact: int4 wins.
    q = onnxq.cast(x, "cb41fi_e2m2fnuz_e8m0_t8s4", mode="actual")
    assert q.meta.tolist() == [0, 1]
    y = onnxq.cast(x, "cb41fi_e2m2fnuz_e8m0_t8s4")
    assert np.array_equal(y, x)  # both subtiles are exact in their chosen mapping


def test_a_user_metric_changes_the_choice() -> None:
    x = np.array([6.0, 0.5, 1.5, 0.5, 5.0, 7.0, 6.0, 5.0], np.float32)

    def prefer_int(v: np.ndarray, q: np.ndarray) -> np.ndarray:
        # Max-abs error, penalising nothing but giving ties to the later mapping via a bias
        # on mapping outputs that are not integers.
        return np.abs(v - q).max(axis=-1) + np.any(q != np.round(q), axis=-1) * 10.0

    q = onnxq.cast(x, "cb41fi_e2m2fnuz_e8m0_t8s4", mode="actual", metric=prefer_int)
    # subtile 0 under fp4 holds 0.5 and 1.5 (non-integers): +10, so int4 wins there too.
    assert q.meta.tolist() == [1, 1]


def test_stochastic_rounding_is_refused_for_codebooks() -> None:
    x = np.ones(8, np.float32)
    with pytest.raises(NotImplementedError, match="stochastic"):
        onnxq.cast(x, "cb41fi_e2m2fnuz_e8m0_t8", round_mode="stochastic")
