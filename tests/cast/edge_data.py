"""Edge-heavy float32 test data shared by the native-kernel tests."""

from __future__ import annotations

import numpy as np

KINDS = ["random", "ties", "pow2", "subnormal", "special", "zeros", "huge"]


def edge_data(shape: tuple[int, ...], kind: str, seed: int) -> np.ndarray:
    """Float32 data of one kind (see KINDS): grids, ties, powers of two, subnormals, specials."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if kind == "random":
        x = rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))
    elif kind == "ties":  # halfway points of many grids, next to powers of two fixing scales
        x = (rng.integers(-64, 64, n) + 0.5) * np.exp2(rng.integers(-12, 4, n))
        x[:: max(1, n // 7)] = np.exp2(rng.integers(-3, 6, x[:: max(1, n // 7)].size))
    elif kind == "pow2":  # powers of two, the float just below and just above each
        v = np.exp2(rng.integers(-149, 128, n).astype(np.float64)).astype(np.float32)
        pick = rng.integers(0, 3, n)
        down = np.nextafter(v, np.float32(0))
        up = np.nextafter(v, np.float32(np.inf))
        x = np.where(pick == 0, down, np.where(pick == 1, v, up)) * rng.choice([-1, 1], n)
    elif kind == "subnormal":
        x = rng.standard_normal(n) * 2.0 ** rng.integers(-149, -120, n)
    elif kind == "special":
        x = rng.standard_normal(n) * np.exp2(rng.integers(-140, 128, n))
        specials = np.array(
            [
                0.0,
                -0.0,
                np.inf,
                -np.inf,
                np.nan,
                -np.nan,
                3.4028235e38,
                -3.4028235e38,
                2.0**-149,
                -(2.0**-149),
                2.0**-126,
                1 - 2**-24,
                448.0,
                464.0,
                6.0,
                7.0,
                0.25,
            ],
        )
        where = rng.integers(0, n, max(1, n // 3))
        x[where] = rng.choice(specials, where.size)
    elif kind == "huge":  # tiles whose scale saturates at the top of E8M0
        x = rng.standard_normal(n) * 2.0**126
    else:
        x = np.zeros(n) * rng.choice([-1, 1], n)  # signed zeros
    with np.errstate(all="ignore"):
        return x.astype(np.float32).reshape(shape)
