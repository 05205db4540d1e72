"""A tour of the cast engine: one weight-like matrix through every preset.

Prints, per preset: bits per value, packed bytes, and the signal-to-quantization-noise ratio
(SQNR, dB) of the fake-quantized matrix against the float one. Run: python examples/tour.py
"""

from __future__ import annotations

import numpy as np

import onnxq


def sqnr_db(x: np.ndarray, y: np.ndarray) -> float:
    noise = float(np.sum((x.astype(np.float64) - y) ** 2))
    return (
        float("inf")
        if noise == 0
        else 10 * np.log10(float(np.sum(x.astype(np.float64) ** 2)) / noise)
    )


def main() -> None:
    rng = np.random.default_rng(0)
    # Weight-like: Gaussian rows with a spread of row norms and a few outliers.
    w = rng.standard_normal((256, 512), dtype=np.float32) * np.exp2(
        rng.uniform(-4, 2, (256, 1))
    ).astype(np.float32)
    w[rng.integers(0, 256, 8), rng.integers(0, 512, 8)] *= 20
    print(f"{'data type':<16} {'code':<28} {'bits/value':>10} {'packed bytes':>12} {'SQNR dB':>8}")
    for name, dt in onnxq.datatypes().items():
        y = onnxq.cast(w, dt)
        q = onnxq.cast(w, dt, mode="compress")
        assert np.array_equal(onnxq.upcast(q), y)  # compress -> upcast is the virtual cast
        row = f"{name:<16} {dt.code:<28} {dt.bits_per_value:>10.3g} {q.nbytes:>12}"
        print(f"{row} {sqnr_db(w, y):>8.2f}")
    print(f"float32 {w.nbytes} bytes")


if __name__ == "__main__":
    main()
