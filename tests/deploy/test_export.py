"""`onnxq export` and onnxq.deploy.export: hardware layouts written, read back, decoded exactly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

import onnxq
from onnxq import cli
from onnxq.cast.api import QTensor
from onnxq.deploy import export as ex
from onnxq.formats.modes import CastMode
from tests.models import builders

ROOT = Path(__file__).resolve().parents[2]
FORMATS = {  # format -> layout
    "bfp16": "bfp-int8",
    "int8_e8m0_t8": "bfp-int8",
    "bfp8": "bfp-int8",
    "mx9": "mx-record",
    "mx6": "mx-record",
    "mx4": "mx-record",
    "mxfp8e4": "ocp-mx",
    "mxfp8e5": "ocp-mx",
    "mxfp6e2": "ocp-mx",
    "mxfp6e3": "ocp-mx",
    "mxfp4": "ocp-mx",
    "mxint8": "ocp-mx",
}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype=np.float32).tobytes()


@pytest.mark.parametrize("fuse", [True, "all"])  # DequantizeMX weights, and MatMulMX ones
@pytest.mark.parametrize("builder", [builders.mlp, builders.cnn, builders.transformer])
@pytest.mark.parametrize(("fmt", "layout"), FORMATS.items())
def test_export_load_upcast_is_bit_exact(
    fmt: str, layout: str, builder: object, fuse: bool | str, tmp_path: Path
) -> None:
    model, _ = builder()  # type: ignore[operator]
    q = onnxq.quantize_model(model, weights=fmt, fuse=fuse)
    if fuse == "all" and builder is not builders.cnn:  # the cnn has no MatMul
        assert any(n.op_type == "MatMulMX" for n in q.graph.node)
    stored = ex.quantized_weights(q)
    want = {name: onnxq.upcast(qt) for name, qt in stored.items()}
    fake = onnxq.quantize_model(model, weights=fmt, weight_storage="fake")
    fake_values = {t.name: onnx.numpy_helper.to_array(t) for t in fake.graph.initializer}
    manifest = ex.export(q, tmp_path / "out")
    got = ex.load(tmp_path / "out")
    assert set(got) == set(want) and want
    for name, ref in want.items():
        entry = got[name]
        assert entry["manifest"]["layout"] == layout
        assert entry["manifest"]["tile_axis"] == stored[name].axis
        assert _bits(onnxq.upcast(entry["qtensor"])) == _bits(ref)
        assert _bits(entry["values"]) == _bits(ref)  # decoded from the layout alone
        assert _bits(ref) == _bits(fake_values[name])  # = the fake-quantized weight
    assert manifest["onnxq_version"] == onnxq.__version__
    on_disk = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert on_disk == manifest


def test_padded_rows_are_said_so(tmp_path: Path) -> None:
    # conv0 has 3 input channels x 3 x 3, fewer input channels than a block of 16: it is
    # tiled over its whole reduction (docs/layouts.md), rows of 27 values = 16 + 11 + 5 padding
    model, _ = builders.cnn()
    q = onnxq.quantize_model(model, weights="mx6", recipe={"op_types": ["Conv"]})
    manifest = ex.export(q, tmp_path / "out")
    conv0 = next(t for t in manifest["tensors"] if t["name"] == "conv0_w")
    assert conv0["padded"] is True and "11 values" in conv0["padding"]
    assert conv0["shape"] == [32, 27] and conv0["weight_shape"] == [32, 3, 3, 3]
    assert conv0["row_length"] == 27 and conv0["blocks_per_row"] == 2
    assert conv0["blobs"]["records"]["length"] == conv0["rows"] * 2 * 12


def test_blob_sizes_and_manifest_fields(tmp_path: Path) -> None:
    model, _ = builders.mlp()
    q = onnxq.quantize_model(model, weights="mx6")
    manifest = ex.export(q, tmp_path / "out")
    data = (tmp_path / "out" / "weights.bin").read_bytes()
    for t in manifest["tensors"]:
        for key in ("name", "shape", "tile_axis", "format", "layout"):
            assert key in t
        assert t["format"] == "mx6" and t["record_bytes"] == 12
        blob = t["blobs"]["records"]
        assert blob["offset"] % 64 == 0
        assert blob["length"] * 8 == 6 * int(np.prod(t["shape"]))  # exactly 6 bits per value
        assert len(data) >= blob["offset"] + blob["length"]


def test_bfp_blob_is_the_bfp_module_layout(tmp_path: Path) -> None:
    """A weight whose tile axis is last is flattened exactly as onnxq.bfp.quantize does."""
    model, _ = builders.mlp()
    q = onnxq.quantize_model(model, weights="bfp16")
    w = next(t for t in model.graph.initializer if t.name == "head_w")  # Gemm transB: axis 1
    ex.export(q, tmp_path / "out")
    got = ex.load(tmp_path / "out")["head_w"]
    packed, _ = onnxq.bfp.quantize(onnx.numpy_helper.to_array(w), "bfp16")
    assert np.array_equal(got["blobs"]["packed"], packed)


def _doc_example() -> tuple[np.ndarray, list[float]]:
    text = (ROOT / "docs" / "layouts.md").read_text()
    hexes = re.search(r"^mx6 record \(hex\): (.+)$", text, re.MULTILINE)
    values = re.search(r"^mx6 values: (.+)$", text, re.MULTILINE)
    assert hexes and values
    record = np.array([int(h, 16) for h in hexes.group(1).split()], dtype=np.uint8)
    return record, [float(v) for v in values.group(1).split()]


def test_docs_worked_example_decodes_to_its_values() -> None:
    record, values = _doc_example()
    assert record.size == 12  # 96 bits: 6 bits per value
    fields = ex.decode_mx_records(record, bits=5)
    assert fields["values"].reshape(-1).tolist() == values
    assert int(fields["exponents"][0]) == 128
    assert fields["shifts"].reshape(-1).tolist() == [0, 1, 0, 0, 0, 0, 0, 1]
    # the same fields through onnxq's own decoder: a one-block MX6 QTensor
    signed = np.where(fields["signs"] == 1, -fields["magnitudes"].astype(int), fields["magnitudes"])
    qt = QTensor(
        data=(signed.reshape(16) & 31).astype(np.uint8),
        dtype=onnxq.datatype("mx6"),
        shape=(16,),
        axis=0,
        mode=CastMode.ACTUAL,
        scale=fields["exponents"].reshape(1),
        meta=fields["shifts"].reshape(8),
    )
    assert onnxq.upcast(qt).tolist() == values


def test_docs_example_values_are_mx6_values() -> None:
    """The doc's values survive an MX6 cast, and the exporter's record of them decodes to them.

    (The cast may shift other pairs than the hand-made record does: pair 2 is below the
    block's 2^floor(log2 max) too, so its record differs in the shift bits and mantissas.)
    """
    _, values = _doc_example()
    x = np.array(values, dtype=np.float32)
    qt = onnxq.cast(x, "mx6", mode="compress")
    assert onnxq.upcast(qt).tolist() == values
    entry, blobs = ex._entry("x", qt)
    decoded = ex.decode_mx_records(blobs["records"], 5)["values"].reshape(-1).tolist()
    assert decoded == values and entry["record_bytes"] == 12


# -- bad input -------------------------------------------------------------------------------
def _saved(tmp_path: Path, model: onnx.ModelProto, name: str = "m.q.onnx") -> Path:
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def _refused(code: int, out: str, err: str, word: str) -> None:
    assert code == 2 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and word in lines[0], err


def test_cli_export_writes_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, _ = builders.mlp()
    src = _saved(tmp_path, onnxq.quantize_model(model, weights="mx6", activations="mx9"))
    code, out, err = _run(["export", str(src), "-o", str(tmp_path / "hw")], capsys)
    assert code == 0, err
    assert "3 weights" in out and "mx-record" in out
    assert {p.name for p in (tmp_path / "hw").iterdir()} == {"manifest.json", "weights.bin"}
    # not empty now: refused without --overwrite, accepted with it
    code, out, err = _run(["export", str(src), "-o", str(tmp_path / "hw")], capsys)
    _refused(code, out, err, "not empty")
    code, out, err = _run(["export", str(src), "-o", str(tmp_path / "hw"), "--overwrite"], capsys)
    assert code == 0, err
    assert set(ex.load(tmp_path / "hw")) == {"w0", "w1", "head_w"}


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({}, "no quantized weights"),  # the float model
        ({"weights": "mxfp4", "weight_storage": "fake"}, "--storage fake"),
        ({"weights": "nvfp4"}, "no hardware layout"),
        ({"weights": "cb41fi_e2m2fnuz_e8m0_t32"}, "codebook"),
        ({"weights": "int8_channel"}, "no hardware layout"),
    ],
)
def test_cli_export_refuses_bad_models(
    kwargs: dict[str, str], word: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, _ = builders.mlp()
    if kwargs:
        model = onnxq.quantize_model(model, **kwargs)  # type: ignore[arg-type]
    src = _saved(tmp_path, model)
    code, out, err = _run(["export", str(src), "-o", str(tmp_path / "hw")], capsys)
    _refused(code, out, err, word)
    assert not (tmp_path / "hw").exists()


def test_cli_export_refuses_missing_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(["export", str(tmp_path / "none.onnx"), "-o", str(tmp_path)], capsys)
    _refused(code, out, err, "does not exist")


@pytest.fixture
def exported(tmp_path: Path) -> Path:
    model, _ = builders.mlp()
    ex.export(onnxq.quantize_model(model, weights="bfp16"), tmp_path / "hw")
    return tmp_path / "hw"


def test_corrupted_blob_is_refused(exported: Path) -> None:
    manifest = json.loads((exported / "manifest.json").read_text())
    blob = manifest["tensors"][1]["blobs"]["packed"]
    data = bytearray((exported / "weights.bin").read_bytes())
    data[blob["offset"] + 5] ^= 0x01
    (exported / "weights.bin").write_bytes(bytes(data))
    with pytest.raises(ex.LoadError, match=r"corrupted: its sha256 does not match"):
        ex.load(exported)


def test_truncated_data_file_is_refused(exported: Path) -> None:
    data = (exported / "weights.bin").read_bytes()
    (exported / "weights.bin").write_bytes(data[:-10])
    with pytest.raises(ex.LoadError, match="truncated"):
        ex.load(exported)


@pytest.mark.parametrize(("key", "value"), [("onnxq_version", "99.0.0"), ("manifest_version", 2)])
def test_newer_manifest_is_refused(exported: Path, key: str, value: object) -> None:
    manifest = json.loads((exported / "manifest.json").read_text())
    manifest[key] = value
    (exported / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ex.LoadError, match="newer than this onnxq"):
        ex.load(exported)


def test_missing_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ex.LoadError, match="not an onnxq export"):
        ex.load(tmp_path)
