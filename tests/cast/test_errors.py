"""Every error of `cast` / `upcast` on bad input, checked by type and by message.

Each ``match`` names the problem: the bad value, the parameter, or what was expected.
"""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from onnxq.cast.api import QTensor, cast, upcast

pytestmark = pytest.mark.filterwarnings("ignore:.*native library.*:RuntimeWarning")

X = np.linspace(-2, 2, 64, dtype=np.float32).reshape(2, 32)


# -- the input -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int8, np.uint8, np.bool_])
def test_wrong_numpy_dtypes_are_type_errors_naming_the_dtype(dtype: type) -> None:
    name = np.dtype(dtype).name
    with pytest.raises(TypeError, match=rf"float32, float16 or bfloat16.*got {name}"):
        cast(X.astype(dtype), "mxfp4")


def test_a_python_list_is_a_type_error_naming_list() -> None:
    with pytest.raises(TypeError, match=r"numpy array.*got list"):
        cast([1.0, 2.0, 3.0], "mxfp4")  # type: ignore[arg-type]


def test_a_duck_typed_array_is_a_type_error_naming_its_type() -> None:
    class FakeTensor:  # shape and dtype, but not an ndarray (as a jax/cupy array would be)
        shape = (4,)
        dtype = np.dtype(np.float32)

    with pytest.raises(TypeError, match=r"numpy array.*got FakeTensor"):
        cast(FakeTensor(), "mxfp4")  # type: ignore[arg-type]


def test_a_torch_tensor_of_a_wrong_dtype_is_a_type_error() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"float32, float16 or bfloat16.*float64"):
        cast(torch.zeros(4, dtype=torch.float64), "mxfp4")
    with pytest.raises(ValueError, match=r"empty"):
        cast(torch.zeros(0, dtype=torch.float32), "mxfp4")


def test_a_torch_object_that_is_not_a_tensor_is_a_type_error() -> None:
    fake = type("Size", (tuple,), {"__module__": "torch"})((4,))
    with pytest.raises(TypeError, match=r"Size"):
        cast(fake, "mxfp4")


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 32)])
def test_empty_tensors_are_value_errors_naming_the_shape(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=re.escape(f"cannot cast an empty tensor (shape {shape})")):
        cast(np.zeros(shape, np.float32), "mxfp4")


def test_a_0d_array_is_a_value_error_suggesting_reshape() -> None:
    with pytest.raises(ValueError, match=r"0-D scalar.*reshape"):
        cast(np.array(1.0, dtype=np.float32), "e4m3fn")


# -- the options ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keyword", "label"),
    [
        ("mode", "mode"),
        ("round_mode", "round_mode"),
        ("scale_mode", "scale_mode"),
        ("nan_policy", "nan_policy"),
        ("backend", "backend"),
    ],
)
def test_unknown_option_strings_name_the_option_and_list_the_choices(
    keyword: str, label: str
) -> None:
    with pytest.raises(ValueError, match=rf"unknown {label} 'bogus': expected one of '"):
        cast(X, "mxfp4", **{keyword: "bogus"})


def test_unknown_round_mode_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"'even', 'away', 'zero', 'stochastic'"):
        cast(X, "mxfp4", round_mode="nearest")


@pytest.mark.parametrize("backend", ["native", "triton"])
def test_an_unavailable_backend_is_not_implemented_naming_it(backend: str) -> None:
    from onnxq.cast import native

    if backend == "native" and native.available():
        pytest.skip("the native library is built here")
    with pytest.raises(NotImplementedError, match=rf"backend '{backend}'"):
        cast(X, "mxfp4", backend=backend)


def test_bad_int_range_names_the_value_and_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown int_range 'wide'.*'symmetric' or 'full'"):
        cast(X, "mxint8", int_range="wide")


def test_an_unknown_dtype_code_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"mxfp5"):
        cast(X, "mxfp5")


def test_a_dtype_of_the_wrong_type_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"dtype must be a DataType or a preset/code string.*int"):
        cast(X, 4)  # type: ignore[arg-type]


# -- geometry ------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [2, -3, 17])
def test_axis_out_of_range_names_the_axis_and_shape(axis: int) -> None:
    with pytest.raises(ValueError, match=rf"axis {axis} is out of range for a 2-D tensor"):
        cast(X, "mxfp4", axis=axis)


def test_a_non_integer_axis_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"axis must be an int, got float"):
        cast(X, "mxfp4", axis=1.0)  # type: ignore[arg-type]


def test_2d_tiles_on_a_1d_tensor_name_the_tiles_and_the_shape() -> None:
    with pytest.raises(ValueError, match=r"2-D tiles 'e8m0_t4_t8' need .*2 dims.*\(32,\)"):
        cast(np.ones(32, np.float32), "e4m3fn_e8m0_t4_t8")


def test_stochastic_rounding_on_a_codebook_is_not_implemented() -> None:
    with pytest.raises(NotImplementedError, match=r"codebooks.*stochastic"):
        cast(X, "cb41fi_e2m2fnuz_e8m0_t32", round_mode="stochastic")


# -- upcast --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [X, [1.0], None, "mxfp4"])
def test_upcast_of_a_non_qtensor_names_what_it_got(value: object) -> None:
    with pytest.raises(TypeError, match=rf"QTensor.*got {type(value).__name__}"):
        upcast(value)  # type: ignore[arg-type]


def test_upcast_of_a_virtual_cast_result_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"QTensor.*got ndarray"):
        upcast(cast(X, "mxfp4"))  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", [np.float64, np.int32, "float64"])
def test_upcast_to_an_unsupported_dtype_names_it(dtype: object) -> None:
    q = cast(X, "mxfp4", mode="actual")
    assert isinstance(q, QTensor)
    with pytest.raises(TypeError, match=rf"float32, float16 or bfloat16, not {np.dtype(dtype)}"):
        upcast(q, dtype)


def test_upcast_without_a_scale_names_the_data_type() -> None:
    q = cast(X, "mxfp4", mode="actual")
    assert isinstance(q, QTensor)
    q.scale = None
    with pytest.raises(ValueError, match=r"mxfp4: dequantizing needs the scale tensor"):
        upcast(q)


# -- the package namespace -----------------------------------------------------------------


def test_onnxq_cast_stays_callable_after_importing_a_submodule() -> None:
    code = (
        "import numpy as np, onnxq, onnxq.cast.elements\n"
        "onnxq.cast(np.ones(4, np.float32), 'e4m3fn')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1]
