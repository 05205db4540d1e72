"""The largest finite value in closed form (Python and C++) and the float64 range limit.

Before the limits, C++ searched down from the top code one code at a time (e11m52b0 never
finished) and Python raised OverflowError from math.ldexp; now both compute the top code
directly and refuse formats whose values leave float64 (docs/formats.md, "Limits").
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest

from onnxq.cast import native
from onnxq.formats import InfNaN, Kind, NumberSpec, limits


def _small_floats() -> list[NumberSpec]:
    """Every float of at most 10 bits with its default bias, in each Inf/NaN convention."""
    specs = []
    for ebits in range(1, 9):
        for mbits in range(0, 10 - ebits):
            for infnan in InfNaN:
                bias = 2 ** (ebits - 1) - 1
                specs.append(
                    NumberSpec(kind=Kind.FLOAT, ebits=ebits, mbits=mbits, bias=bias, infnan=infnan)
                )
    return specs


SMALL = _small_floats()


def test_maxfloat_is_the_largest_finite_code_value() -> None:
    # The oracle is a search over every code, the algorithm the closed form replaced.
    for spec in SMALL:
        finite = [v for c in range(1 << spec.bits) if math.isfinite(v := spec.decode(c))]
        assert spec.maxfloat == max(finite), spec


@pytest.mark.needs_native
def test_cpp_derives_the_same_maxfloat() -> None:
    for spec in SMALL:
        derived = native.number_info(spec)
        want = (spec.bits, spec.maxfloat, spec.emax, spec.emin, spec.midmax, spec.float32_max)
        assert derived == want, spec


@pytest.mark.parametrize(
    ("ebits", "mbits", "bias", "infnan", "fits"),
    [
        (11, 52, 1023, InfNaN.IEEE, True),  # float64: top field 2046 - 1023 = 1023
        (11, 52, 1022, InfNaN.IEEE, False),  # 2046 - 1022 = 1024
        (11, 20, 1055, InfNaN.IEEE, True),  # smallest step 2^(1 - 1055 - 20) = 2^-1074
        (11, 20, 1056, InfNaN.IEEE, False),  # 2^-1075
        (10, 3, 0, InfNaN.FNUZ, True),  # top field 1023 - 0
        (10, 3, 0, InfNaN.IEEE, True),  # top field 1022
        (11, 0, 1023, InfNaN.INUZ, True),  # Inf takes field 2047, so 2046 - 1023
        (11, 0, 1022, InfNaN.FNUZ, False),  # field 2047 is finite in fnuz: 2047 - 1022
    ],
)
def test_the_float64_range_limit(
    ebits: int, mbits: int, bias: int, infnan: InfNaN, fits: bool
) -> None:
    def build() -> NumberSpec:
        return NumberSpec(kind=Kind.FLOAT, ebits=ebits, mbits=mbits, bias=bias, infnan=infnan)

    if fits:
        assert math.isfinite(build().maxfloat)
        if native.available():
            assert native.number_info(build())[1] == build().maxfloat
        return
    with pytest.raises(ValueError, match="float64"):
        build()


def test_exponent_types_stop_at_ten_bits() -> None:
    assert NumberSpec(kind=Kind.EXPONENT, ebits=10, mbits=0, bias=511).maxfloat == 2.0**511
    with pytest.raises(ValueError, match="at most 10 bits"):
        NumberSpec(kind=Kind.EXPONENT, ebits=limits.MAX_EXPONENT_TYPE_BITS + 1, mbits=0, bias=1023)


@pytest.mark.needs_native
def test_cpp_refuses_out_of_range_numbers_through_the_c_abi() -> None:
    # Raw structs (the C ABI takes any), in a subprocess: these searched for minutes before.
    script = textwrap.dedent(
        """
        import ctypes
        from onnxq.cast import native
        lib = native._lib()
        for fields in [(0, 11, 52, 0, 1), (0, 11, 20, 0, 1), (0, 11, 17, 0, 3), (3, 16, 0, 0, 0),
                       (0, 12, 3, 2047, 1)]:
            out = (ctypes.c_double * 6)()
            err = ctypes.create_string_buffer(256)
            status = lib.onnxq_number_info(ctypes.byref(native._Number(*fields)), out, err, 256)
            assert status != 0, fields
            print(err.value.decode())
        """
    )
    done = subprocess.run(
        [sys.executable, "-"], input=script, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 5 and "2^2046" in lines[0] and "at most 10 bits" in lines[3], lines


@pytest.mark.parametrize("backend", ["reference", "native"])
def test_cast_refuses_an_out_of_range_format_with_value_error(backend: str) -> None:
    # The reference raised OverflowError from math.ldexp here (e11m17b0's values reach 2^2046).
    if backend == "native" and not native.available():
        pytest.skip("libonnxq_ops is not built")
    import numpy as np

    import onnxq

    with pytest.raises(ValueError, match="2\\^2046"):
        onnxq.cast(np.ones((2, 32), np.float32), "e11m17b0", backend=backend)
