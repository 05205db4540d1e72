"""`quantize_model` and external data (issue 4): inputs read one tensor at a time, outputs
written tensor by tensor with external data, inputs untouched, nothing left behind on failure.

The size thresholds of onnxq.graph.model_io are lowered with monkeypatch so small models take
the paths that large ones take (``benchmarks/memory.py`` measures the real thing: a 3 GiB model).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import external_data_helper, numpy_helper

from onnxq._files import all_tensors
from onnxq.graph import model_io as q
from onnxq.graph.quantize import quantize_model
from tests.models import builders

_LOAD_DATA = external_data_helper.load_external_data_for_model  # before the fixture refuses it
CASES = [{"weights": "mxfp4"}, {"weights": "mxfp8e4", "weight_storage": "fake"}]


def _save_external(model: onnx.ModelProto, path: Path) -> None:
    """Every tensor (Constant attributes and subgraph initializers too) in ``path.data``."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # onnx.save_model converts the model it is given
    onnx.save_model(
        copy,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=f"{path.name}.data",
        size_threshold=0,
        convert_attribute=True,
    )


def _load(path: Path) -> onnx.ModelProto:
    """The written model with its external data (read by onnx, not by onnxq)."""
    model = onnx.load(str(path), load_external_data=False)
    _LOAD_DATA(model, str(path.parent))
    return model


def _digest(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}


def _tensors(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in all_tensors(model)}


def _external_count(model: onnx.ModelProto) -> int:
    return sum(t.data_location == onnx.TensorProto.EXTERNAL for t in all_tensors(model))


@pytest.fixture
def lazy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Small tensors take the large-tensor paths; returns the sizes of external reads."""
    monkeypatch.setattr(q, "_INLINE_BYTES", 0)
    monkeypatch.setattr(q, "_PARK_BYTES", 0)
    reads: list[int] = []
    original = q._external_bytes

    def spy(tensor: onnx.TensorProto, spill: q.Spill | None) -> np.ndarray:
        out = original(tensor, spill)
        reads.append(out.nbytes)
        return out

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the whole external data was loaded")

    monkeypatch.setattr(q, "_external_bytes", spy)
    monkeypatch.setattr(external_data_helper, "load_external_data_for_model", refuse)
    monkeypatch.setattr(onnx, "load_external_data_for_model", refuse)
    return reads


@pytest.mark.parametrize("kwargs", CASES, ids=["packed", "fake"])
@pytest.mark.parametrize("name", ["mlp", "if_constant"])
def test_external_input_round_trips_lazily(
    tmp_path: Path, lazy: list[int], name: str, kwargs: dict[str, str]
) -> None:
    model, _ = builders.BUILDERS[name]()
    expected = quantize_model(model, **kwargs)  # in memory, no external data anywhere
    src = tmp_path / "src"
    src.mkdir()
    _save_external(model, src / "m.onnx")
    before = _digest(src)
    largest = max(numpy_helper.to_array(t).nbytes for t in all_tensors(model))

    out = tmp_path / "out" / "q.onnx"
    out.parent.mkdir()
    returned = quantize_model(src / "m.onnx", out, **kwargs)

    assert _digest(src) == before  # the input model and its data are untouched
    assert sorted(f.name for f in out.parent.iterdir()) == ["q.onnx", "q.onnx.data"]
    assert lazy and max(lazy) <= largest  # one tensor per read, never the whole file
    onnx.checker.check_model(str(out), full_check=True)
    assert _external_count(returned) > 0
    assert all(
        e.value == "q.onnx.data"
        for t in all_tensors(returned)
        for e in t.external_data
        if e.key == "location"
    )
    written = _load(out)  # external data loaded from beside the output
    assert _external_count(onnx.load(str(out), load_external_data=False)) > 0
    got, want = _tensors(written), _tensors(expected)
    assert got.keys() == want.keys()
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
    assert [n.op_type for n in written.graph.node] == [n.op_type for n in expected.graph.node]


@pytest.mark.parametrize("threshold", [None, 1])
def test_output_over_threshold_gets_external_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threshold: int | None
) -> None:
    model, _ = builders.mlp()
    if threshold is not None:
        monkeypatch.setattr(q, "_EXTERNAL_BYTES", threshold)
    path = tmp_path / "m.onnx"
    onnx.save_model(model, path)  # no external data in the input
    out = tmp_path / "q.onnx"
    quantize_model(path, out, weights="mxfp8e4", weight_storage="fake")
    files = sorted(f.name for f in tmp_path.iterdir())
    stored = onnx.load(str(out), load_external_data=False)
    if threshold is None:  # a small output stays one file
        assert files == ["m.onnx", "q.onnx"]
        assert _external_count(stored) == 0
    else:
        assert files == ["m.onnx", "q.onnx", "q.onnx.data"]
        assert _external_count(stored) > 0
    onnx.checker.check_model(str(out), full_check=True)
    want = _tensors(quantize_model(model, weights="mxfp8e4", weight_storage="fake"))
    got = _tensors(_load(out))
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_overwrite_in_place_keeps_a_valid_model(tmp_path: Path, lazy: list[int]) -> None:
    model, _ = builders.mlp()
    path = tmp_path / "m.onnx"
    _save_external(model, path)
    quantize_model(path, path, weights="mxfp4", overwrite=True)
    # The new data never replaces the old (a kill could pair them): it takes a fresh name,
    # and the replaced model's m.onnx.data is removed after the commit.
    files = sorted(f.name for f in tmp_path.iterdir())
    assert len(files) == 2 and files[0] == "m.onnx" and files[1].startswith("m.onnx."), files
    assert {
        e.value
        for t in onnx.load(path, load_external_data=False).graph.initializer
        for e in t.external_data
        if e.key == "location"
    } == {files[1]}
    onnx.checker.check_model(str(path), full_check=True)
    want = _tensors(quantize_model(model, weights="mxfp4"))
    got = _tensors(_load(path))
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


@pytest.mark.parametrize("where", ["quantizing", "checking"])
def test_failure_leaves_no_file(
    tmp_path: Path, lazy: list[int], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    model, _ = builders.mlp()
    src = tmp_path / "m.onnx"
    _save_external(model, src)
    before = _digest(tmp_path)

    def boom(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("boom")

    if where == "quantizing":  # after the first weight was parked in the spill
        calls = {"n": 0}
        original = q.Spill.put

        def put_then_fail(self: q.Spill, tensor: onnx.TensorProto, data: object) -> None:
            calls["n"] += 1
            if calls["n"] > 2:
                raise RuntimeError("boom")
            original(self, tensor, data)  # type: ignore[arg-type]

        monkeypatch.setattr(q.Spill, "put", put_then_fail)
    else:  # after the data file was written, before anything is renamed into place
        monkeypatch.setattr(onnx.checker, "check_model", boom)
    with pytest.raises(RuntimeError, match="boom"):
        quantize_model(src, tmp_path / "q.onnx", weights="mxfp8e4", weight_storage="fake")
    assert _digest(tmp_path) == before  # no output, no temporary file, input untouched


def test_missing_or_short_external_data_is_a_clear_error(tmp_path: Path) -> None:
    model, _ = builders.mlp()
    src = tmp_path / "m.onnx"
    _save_external(model, src)
    data = tmp_path / "m.onnx.data"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(ValueError, match="too short"):
        quantize_model(src, tmp_path / "q.onnx", weights="mxfp4")
    data.unlink()
    with pytest.raises(ValueError, match="is missing"):
        quantize_model(src, tmp_path / "q.onnx", weights="mxfp4")
    assert sorted(f.name for f in tmp_path.iterdir()) == ["m.onnx"]
