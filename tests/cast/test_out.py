"""cast(..., out=): the result written into a given array, or into x itself, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import onnxq
from onnxq.cast import native
from onnxq.formats.datatype import datatypes
from tests.cast.edge_data import edge_data

BACKENDS = ["reference"] + (["native"] if native.available() else [])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(datatypes()))
def test_out_and_in_place_equal_a_fresh_result(name: str, backend: str) -> None:
    for shape, kind in (((5, 70), "special"), ((3, 64), "random"), ((2, 3, 33), "ties")):
        x = edge_data(shape, kind, seed=len(name))
        with np.errstate(all="ignore"):
            want = onnxq.cast(x, name, backend=backend)
            out = np.full_like(x, 7.0)
            got = onnxq.cast(x, name, backend=backend, out=out)
            assert got is out
            assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), (name, shape)
            y = x.copy()
            got = onnxq.cast(y, name, backend=backend, out=y)
            assert got is y
            assert np.array_equal(y.view(np.uint32), want.view(np.uint32)), (name, shape)


def test_out_float16_in_place() -> None:
    x = edge_data((4, 64), "random", seed=1).astype(np.float16)
    want = onnxq.cast(x, "mxfp8e4")
    y = x.copy()
    onnxq.cast(y, "mxfp8e4", out=y)
    assert np.array_equal(y.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize(
    ("out", "kw", "err", "match"),
    [
        (np.empty((4, 32), np.float32), {"mode": "actual"}, ValueError, "virtual casts"),
        ([0.0] * 128, {}, TypeError, "numpy array"),
        (np.empty((4, 33), np.float32), {}, ValueError, "shape"),
        (np.empty((4, 32), np.float16), {}, ValueError, "dtype"),
        (np.empty((32, 4), np.float32).T, {}, ValueError, "C-contiguous"),
    ],
)
def test_bad_out_is_refused(out: object, kw: dict, err: type, match: str) -> None:
    x = np.ones((4, 32), np.float32)
    with pytest.raises(err, match=match):
        onnxq.cast(x, "mxfp4", out=out, **kw)


def test_read_only_out_is_refused() -> None:
    x = np.ones((4, 32), np.float32)
    out = np.empty_like(x)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        onnxq.cast(x, "mxfp4", out=out)
