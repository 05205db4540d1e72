"""Fuzz: the native cast equals the numpy reference bit for bit on adversarial values.

Seeded and bounded (hypothesis, derandomized): ties, values next to FLT_MAX and the float16 /
bfloat16 maxima, subnormals, NaN and Inf, a single nonzero, odd tails, every axis, many data
types (codebooks, N:M sparsity, MX6, NVFP4, zero points), both NaN policies and int ranges.
Also checks that finite input decodes to finite values (docs/ops.md, "Saturation").
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import onnxq  # noqa: E402

_ = onnxq.cast  # resolve the lazy attribute before importing the subpackage (test_native.py)
from onnxq.cast.api import cast  # noqa: E402
from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode  # noqa: E402

pytestmark = pytest.mark.needs_native

NAMES = [
    *onnxq.datatypes(),
    "cb41fi_e2m2fnuz_e8m0_t32",
    "cb42fi012_e2m2fnuz_e8m0_t16s4",
    "cb41fi_e2m2fnuz_e8m0_t8",
    "e2m1fnuz_e8m0_t16n2m4",
    "int8_e8m0_t8n2m4_t8",
    "int8_e8m0_t8s2_t8s2",
    "uint4_float16_float16_t32",
    "e4m3fnuz_float16_t0",
    "e3m2_e8m0_t32",
    "e11m10",
    "e8m10",
    "e5m2",
]
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def _specials(dtype) -> list[float]:
    fmax = float(ml_dtypes.finfo(dtype).max)
    tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
    return [
        0.0, -0.0, np.inf, -np.inf, np.nan, fmax, -fmax, fmax * 0.999, -fmax * 0.75, fmax / 2,
        tiny, -tiny, tiny * 3, float(ml_dtypes.finfo(dtype).smallest_normal),
        # ties of the element grids (k + 1/2 on grids of step 1, 2^-1, 2^-2, ...)
        0.5, 1.5, 2.5, -2.5, 0.25, 0.75, 5.0, 7.0, 0.125, 6.0, 448.0, 464.0, 240.0, 3.0,
    ]  # fmt: skip


@st.composite
def _case(draw):
    name = draw(st.sampled_from(NAMES))
    dname = draw(st.sampled_from(sorted(DTYPES)))
    dtype = DTYPES[dname]
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 37), min_size=ndim, max_size=ndim)))
    axis = draw(st.integers(-ndim, ndim - 1))
    size = int(np.prod(shape))
    kind = draw(st.sampled_from(["mixed", "single", "near_max", "specials", "scaled"]))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    pool = np.array(_specials(dtype))
    if kind == "single":  # one nonzero value in a tensor of zeros
        x = np.zeros(size)
        x[rng.integers(size)] = rng.choice(pool)
    elif kind == "near_max":
        fmax = float(ml_dtypes.finfo(dtype).max)
        x = fmax * rng.uniform(0.45, 1.0, size) * rng.choice([-1.0, 1.0], size)
    elif kind == "specials":
        x = rng.choice(pool, size)
    elif kind == "scaled":  # one binade per tensor, anywhere in the range
        x = rng.standard_normal(size) * 2.0 ** int(rng.integers(-140, 128))
    else:
        x = rng.standard_normal(size) * 2.0 ** rng.integers(-30, 30, size)
        where = rng.random(size) < 0.3
        x[where] = rng.choice(pool, int(where.sum()))
    with np.errstate(over="ignore"):
        x = x.reshape(shape).astype(dtype)
    smode = draw(st.sampled_from([m.value for m in ScaleMode]))
    rmodes = [m.value for m in RoundMode if not (name.startswith("cb") and m.value == "stochastic")]
    rmode = draw(st.sampled_from(rmodes))
    kw = dict(
        axis=axis,
        scale_mode=smode,
        round_mode=rmode,
        nan_policy=draw(st.sampled_from([m.value for m in NanPolicy])),
        int_range=draw(st.sampled_from(["symmetric", "full"])),
        seed=draw(st.integers(0, 2**31)),
    )
    return name, x, kw


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit equality, every NaN counted equal (the casts canonicalize NaN anyway)."""
    a32, b32 = np.asarray(a).astype(np.float32), np.asarray(b).astype(np.float32)
    nan = np.isnan(a32)
    return bool(
        np.array_equal(nan, np.isnan(b32))
        and np.array_equal(
            np.where(nan, 0, a32).view(np.uint32), np.where(nan, 0, b32).view(np.uint32)
        )
    )


@settings(
    max_examples=600,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(_case())
def test_native_matches_reference(case):
    name, x, kw = case
    try:
        ref = cast(x, name, backend="reference", **kw)
    except ValueError:
        return  # geometry the data type refuses (2-D tiles on 1-D data): both refuse alike
    nat = cast(x, name, backend="native", **kw)
    assert _same(ref, nat), (name, x.dtype, kw)
    # Finite input never decodes to Inf (NaN only where the NaN policy poisons a tile); an
    # all-finite tensor decodes to finite values.
    finite = np.isfinite(x.astype(np.float32))
    y = np.asarray(nat).astype(np.float32)
    assert not np.isinf(y[finite]).any(), (name, x.dtype, kw)
    if finite.all():
        assert np.isfinite(y).all(), (name, x.dtype, kw)
    qr = cast(x, name, backend="reference", mode="actual", **kw)
    qn = cast(x, name, backend="native", mode="actual", **kw)
    for field in ("data", "scale", "zero", "tenscale", "meta", "mask"):
        a, b = getattr(qr, field), getattr(qn, field)
        assert (a is None) == (b is None), field
        if a is not None:
            np.testing.assert_array_equal(a, b, err_msg=f"{field} {name} {x.dtype} {kw}")
