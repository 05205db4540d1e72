"""The Triton engine saturates like the reference: finite input never decodes to Inf.

Near-max tiles of float32, float16 and bfloat16 data through the general kernel (stochastic
and away rounding), the fast path (round-half-even) and the codebook kernel, with the scale
modes and int ranges that push the top element values past the data type's range
(docs/ops.md, "Saturation"). Without a GPU they run in Triton's interpreter.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.cast.triton.support import NP_DT, assert_same, to_torch

# isort: split
from onnxq.cast.api import cast

CASES = [
    # (data type, scale mode, int range, round mode): fast path (even), general (others)
    ("mxfp4", "rceil", "symmetric", "even"),
    ("mxfp4", "ceil", "symmetric", "stochastic"),
    ("mxfp8", "even", "symmetric", "away"),
    ("mxint8", "floor", "full", "even"),
    ("mxint8", "floor", "full", "zero"),
    ("mx6", "floor", "full", "even"),
    ("mx9", "floor", "full", "stochastic"),
    ("nvfp4", "floor", "symmetric", "even"),
    ("int8_channel", "floor", "symmetric", "away"),
    ("uint8_tensor", "floor", "symmetric", "even"),
    ("uint4_float16_float16_t32", "floor", "symmetric", "even"),
    ("cb41fi_e2m2fnuz_e8m0_t32", "rceil", "symmetric", "even"),
    ("cb42fi012_e2m2fnuz_e8m0_t16s4", "topbinade", "symmetric", "away"),
]


def _near_max(dtype: str, seed: int) -> np.ndarray:
    fmax = float(ml_dtypes.finfo(NP_DT[dtype]).max)
    rng = np.random.default_rng(seed)
    x = fmax * rng.uniform(0.5, 1.0, (3, 32)) * rng.choice([-1.0, 1.0], (3, 32))
    x[0] = 0.0
    x[0, 0] = fmax
    x[1, :] = -fmax * rng.uniform(0.97, 1.0, 32)
    x[2, 3] = np.inf
    return x.astype(NP_DT[dtype])


# Each case on one data type (in turn), to keep the interpreter's time down.
@pytest.mark.parametrize(
    ("name", "smode", "int_range", "rmode", "dtype"),
    [(*case, ("float32", "float16", "bfloat16")[k % 3]) for k, case in enumerate(CASES)]
    + [
        ("mxfp4", "rceil", "symmetric", "even", "bfloat16"),
        ("mxint8", "floor", "full", "even", "float16"),
    ],
)
def test_triton_saturates_like_reference(name, smode, int_range, rmode, dtype):
    x = _near_max(dtype, 5)
    kw = dict(scale_mode=smode, int_range=int_range, round_mode=rmode, seed=9)
    want = cast(x, name, backend="reference", **kw)
    got = cast(to_torch(x, dtype), name, backend="triton", **kw)
    assert_same(got, want, f"{name} {dtype} {kw}")
    finite = np.isfinite(x.astype(np.float32))
    assert np.isfinite(np.asarray(want).astype(np.float32)[finite]).all()
