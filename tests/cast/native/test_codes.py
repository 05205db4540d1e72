"""The native fast path's codes (actual / compress casts and QuantizeMX) equal the reference bit
for bit.

The fast row kernels also produce element codes, scale codes (E8M0 and friends, the float scale
of NVFP4) and MX shift bits for float32 tensors tiled along their last axis, and QuantizeMX has
them write its packed Q stream in place. Each case is compared with the reference engine and
with the general path (`ONNXQ_SIMD=none`), on every instruction set the machine has.
"""

from __future__ import annotations

import numpy as np
import pytest

import onnxq
from onnxq import runtime
from tests.cast.edge_data import KINDS, edge_data

pytestmark = pytest.mark.needs_native

FORMATS = [
    "mxfp4", "mxfp6", "mxfp6e2", "mxfp8e4", "mxfp8e5", "mxint8", "mxint4", "mx4", "mx6", "mx9",
    "bfp16", "bfp8", "nvfp4", "int8_e8m0_t8", "e2m1fnuz_e4m3fn_t16", "int4_e4m3fn_t16",
    "e4m3fn_e5m2_t8", "e4m3fn_e8m0_t64", "e5m2_e8m0_t32", "e3m2_e8m0_t32", "int8_e8m0_t8s2",
]  # fmt: skip
SIMD = ["base", "avx2", "avx512"]
SHAPES = [(6, 35), (3, 100), (2, 3, 33), (1,), (5, 8), (4, 1), (2, 130), (3, 64), (2, 1100)]
FIELDS = ["data", "scale", "zero", "tenscale", "meta", "mask"]


def _fields(q: onnxq.QTensor | object) -> dict[str, np.ndarray | None]:
    out = {}
    for f in FIELDS:
        v = getattr(q, f, None)
        out[f] = None if v is None else np.asarray(v)
    return out


def _same(want: dict, got: dict, what: str) -> None:
    for f in FIELDS:
        w, g = want[f], got[f]
        if w is None or g is None:
            assert (w is None) == (g is None), f"{what}: {f} present on one side only"
            continue
        assert w.dtype == g.dtype and w.shape == g.shape, (
            f"{what}: {f} {w.dtype}{w.shape} vs {g.dtype}{g.shape}"
        )
        if not np.array_equal(w.view(np.uint8), g.view(np.uint8)):
            i = np.flatnonzero(w.reshape(-1) != g.reshape(-1))[:5]
            pytest.fail(
                f"{what}: {f} differs at {i.tolist()}: want {w.reshape(-1)[i].tolist()} "
                f"got {g.reshape(-1)[i].tolist()}"
            )


def _cast(x, name, mode, backend, **kw):
    with np.errstate(all="ignore"):
        return _fields(onnxq.cast(x, name, mode=mode, backend=backend, **kw))


def _check(x, name, mode, monkeypatch, simds=SIMD, **kw) -> None:
    want = _cast(x, name, mode, "reference", **kw)
    monkeypatch.setenv("ONNXQ_SIMD", "none")
    general = _cast(x, name, mode, "native", **kw)
    _same(want, general, f"{name} {mode} none {kw}")
    for simd in simds:
        monkeypatch.setenv("ONNXQ_SIMD", simd)
        _same(want, _cast(x, name, mode, "native", **kw), f"{name} {mode} {simd} {kw}")


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("kind", KINDS)
def test_codes_equal_reference(name: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for i, shape in enumerate(SHAPES):
        x = edge_data(shape, kind, seed=hash((name, kind, i)) % 2**32)
        _check(x, name, "actual", monkeypatch)


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("policy", ["element", "block"])
@pytest.mark.parametrize("rmode", ["even", "away", "zero"])
def test_codes_modes(name: str, policy: str, rmode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for kind in ["special", "ties"]:
        x = edge_data((7, 67), kind, seed=11)
        _check(x, name, "actual", monkeypatch, nan_policy=policy, round_mode=rmode)


@pytest.mark.parametrize("name", FORMATS)
def test_compress_equal_reference(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for shape in [(5, 33), (4, 64), (2, 3, 17)]:
        _check(edge_data(shape, "special", seed=3), name, "compress", monkeypatch)


@pytest.mark.parametrize("name", ["mxfp4", "mxint8", "mx6", "nvfp4", "bfp16"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_codes_axes(name: str, axis: int, monkeypatch: pytest.MonkeyPatch) -> None:
    x = edge_data((5, 40, 3), "random", seed=axis + 7)
    _check(x, name, "actual", monkeypatch, axis=axis)


@pytest.mark.parametrize("name", ["mxfp8e4", "mxint8", "mx9"])
def test_codes_scale_modes_and_int_range(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x = edge_data((6, 70), "ties", seed=5)
    for smode in ["floor", "ceil", "even"]:
        _check(x, name, "actual", monkeypatch, simds=["avx2"], scale_mode=smode)
    _check(x, name, "actual", monkeypatch, simds=["avx2"], int_range="full")


# -- QuantizeMX in an onnxruntime session: Q packed in place ----------------------------------
def _session_outputs(name: str, x: np.ndarray, **attrs) -> dict[str, np.ndarray]:
    from onnx import TensorProto, helper

    from onnxq.graph.schemas import output_types

    types = output_types("QuantizeMX", {"dtype": name, "axis": -1}, x.shape)
    q_out = ["q", "scale", "zero", "tenscale", "meta", "mask"]
    names = [n if elem else "" for n, (elem, _) in zip(q_out, types, strict=True)]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(
        "QuantizeMX", ["x"], names, domain="onnxq", dtype=name, axis=-1, **attrs
    )
    outs = [
        helper.make_tensor_value_info(n, elem, None)
        for n, (elem, _) in zip(names, types, strict=False)
        if n
    ]
    graph = helper.make_graph(
        [node], "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)], outs
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("onnxq", 1)]
    )
    sess = runtime.session(model)
    got = [n for n in names if n]
    return dict(zip(got, sess.run(got, {"x": x}), strict=True))


@pytest.mark.needs_custom_ops
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("policy", ["element", "block"])
def test_session_packed_in_place(name: str, policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Odd widths (a stream whose tiles do not start on a byte: packed afterwards), even ones
    # (packed in place) and a large tensor split over threads.
    for shape in [(5, 33), (4, 64), (3, 35), (64, 256), (1, 7)]:
        x = edge_data(shape, "special", seed=shape[1])
        monkeypatch.setenv("ONNXQ_SIMD", "none")
        want = _session_outputs(name, x, nan_policy=policy)
        ref = _cast(x, name, "compress", "reference", nan_policy=policy)
        assert np.array_equal(want["q"].view(np.uint8), ref["data"].view(np.uint8).reshape(-1))
        if ref.get("meta") is not None and "meta" in want:
            assert np.array_equal(want["meta"].view(np.uint8), ref["meta"].reshape(-1)), name
        for simd in SIMD:
            monkeypatch.setenv("ONNXQ_SIMD", simd)
            got = _session_outputs(name, x, nan_policy=policy)
            for k in want:
                assert np.array_equal(want[k].view(np.uint8), got[k].view(np.uint8)), (
                    f"{name} {shape} {simd}: {k}"
                )


@pytest.mark.parametrize(
    "name", ["int5_e8m0_t16s2", "int8_e8m0_t64s2", "int4_e8m0_t16s4", "int8_e8m0_t8s2", "mx4"]
)
def test_session_shift_bits_in_place_or_packed_afterwards(name: str) -> None:
    # MX shift bits go straight into Meta where every tile's bits start on a byte (t16s2,
    # t64s2 on rows of a multiple of 16 pairs), through a byte buffer elsewhere (t8s2: four
    # bits a tile; odd rows; subtiles of 4); both must equal the reference's packed stream.
    for shape in [(3, 96), (2, 272), (4, 200), (3, 61)]:
        for kind in ("random", "special"):
            x = edge_data(shape, kind, seed=shape[1])
            got = _session_outputs(name, x)
            ref = _cast(x, name, "compress", "reference")
            where = (name, shape, kind)
            assert np.array_equal(got["q"].view(np.uint8), ref["data"].reshape(-1)), where
            assert np.array_equal(got["meta"].view(np.uint8), ref["meta"].reshape(-1)), where
