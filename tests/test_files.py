"""Paths and sizes taken from hostile model files and export manifests.

A model's external-data ``location`` and a manifest's ``data_file`` must name a regular file
inside the model's (manifest's) folder after symbolic links are resolved, and declared
offsets and lengths must fit that file. Anything else is refused with a one-line error
before a byte is read: through the Python API (ValueError / LoadError) and through the CLI
(exit status 2, one line on stderr, no traceback, no output file left behind).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxq import runtime
from onnxq.deploy import export as ex
from onnxq.graph.quantize import quantize_model

ROOT = Path(__file__).resolve().parents[1]
SECRET = b"onnxq-secret-bytes-" * 64  # 1216 bytes that must never reach an output file
W_SHAPE = (16, 16)
W_BYTES = 16 * 16 * 4


@pytest.fixture(autouse=True)
def _deadline() -> Iterator[None]:
    """Fail (instead of hanging) when a read of /dev/urandom or a FIFO never ends."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError("the read did not finish in 30 s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# -- hostile models ----------------------------------------------------------------------------
def _model(location: str, offset: str | None = None, length: str | None = None) -> onnx.ModelProto:
    """x (1x16) @ w (16x16, external data at ``location``) -> y."""
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=W_SHAPE)
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value=location)
    for key, value in (("offset", offset), ("length", length)):
        if value is not None:
            w.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")],
        "hostile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret.bin"
    path.write_bytes(SECRET)
    return path


def _good_data(folder: Path) -> Path:
    path = folder / "w.data"
    path.write_bytes(np.arange(256, dtype=np.float32).tobytes())
    return path


# Each case: (folder holding m.onnx, tmp_path) -> the model, after preparing files around it.
Case = Callable[[Path, Path], onnx.ModelProto]


def _symlink_out(folder: Path, tmp: Path) -> onnx.ModelProto:
    (folder / "w.data").symlink_to(_secret(tmp))
    return _model("w.data")


def _symlinked_folder_out(folder: Path, tmp: Path) -> onnx.ModelProto:
    _secret(tmp)
    (folder / "sub").symlink_to(tmp)
    return _model("sub/secret.bin", length=str(W_BYTES))


def _symlink_dev_zero(folder: Path, tmp: Path) -> onnx.ModelProto:
    (folder / "w.data").symlink_to("/dev/zero")
    return _model("w.data", length=str(W_BYTES))


def _fifo(folder: Path, tmp: Path) -> onnx.ModelProto:
    os.mkfifo(folder / "w.data")
    return _model("w.data", length=str(W_BYTES))


def _a_folder(folder: Path, tmp: Path) -> onnx.ModelProto:
    (folder / "w.data").mkdir()
    return _model("w.data")


def _with_data(offset: str | None, length: str | None) -> Case:
    def make(folder: Path, tmp: Path) -> onnx.ModelProto:
        _good_data(folder)
        return _model("w.data", offset, length)

    return make


MODEL_CASES: dict[str, tuple[Case, str]] = {  # case -> (builder, what the error names)
    "absolute": (lambda f, t: _model(str(_secret(t)), length=str(W_BYTES)), "absolute"),
    "etc-passwd": (lambda f, t: _model("/etc/passwd"), "absolute"),
    "dotdot": (lambda f, t: (_secret(t), _model("../secret.bin", length=str(W_BYTES)))[1], r"\.\."),
    "dotdot-deep": (lambda f, t: _model("../../../../../../etc/passwd"), r"\.\."),
    "inner-dotdot": (lambda f, t: (_good_data(f), _model("x/../w.data"))[1], r"\.\."),
    "backslash-dotdot": (lambda f, t: _model("..\\secret.bin"), r"\.\."),
    "dev-zero": (lambda f, t: _model("/dev/zero", length=str(W_BYTES)), "absolute"),
    "dev-urandom": (lambda f, t: _model("/dev/urandom"), "absolute"),
    "empty": (lambda f, t: _model(""), "non-empty relative path"),
    "nul": (lambda f, t: _model("w.data\0x"), "NUL"),
    "symlink-out": (_symlink_out, "leads out"),
    "symlinked-folder-out": (_symlinked_folder_out, "leads out"),
    "symlink-dev-zero": (_symlink_dev_zero, "leads out"),
    "fifo": (_fifo, "not a regular file"),
    "folder": (_a_folder, "not a regular file"),
    "missing": (lambda f, t: _model("nope.data"), "missing"),
    "offset-past-eof": (_with_data("4096", str(W_BYTES)), "too short"),
    "length-past-eof": (_with_data("0", "4096"), "too short"),
    "length-overflow": (_with_data("0", "18446744073709551617"), "too short"),
    "offset-overflow": (_with_data("18446744073709551615", "1024"), "too short"),
    "negative-offset": (_with_data("-1", str(W_BYTES)), "not a non-negative decimal"),
    "hex-length": (_with_data("0", "0x400"), "not a non-negative decimal"),
    "underscore-length": (_with_data("0", "1_024"), "not a non-negative decimal"),
    "unicode-digits": (_with_data("٠", str(W_BYTES)), "not a non-negative decimal"),
    "length-not-dims": (_with_data("0", "512"), "need 1024"),
}


@pytest.fixture(params=sorted(MODEL_CASES))
def hostile_model(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    """(the hostile model's path in its own folder, the pattern its error must match)."""
    build, pattern = MODEL_CASES[request.param]
    folder = tmp_path / "model"
    folder.mkdir()
    path = folder / "m.onnx"
    path.write_bytes(build(folder, tmp_path).SerializeToString())
    return path, pattern


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.is_symlink()}


def _one_line_error(err: BaseException, pattern: str) -> None:
    text = str(err)
    assert "\n" not in text, text
    assert __import__("re").search(pattern, text), text


def test_quantize_refuses_hostile_external_data(
    hostile_model: tuple[Path, str], tmp_path: Path
) -> None:
    path, pattern = hostile_model
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    before = _files(path.parent)
    for output in (out_dir / "q.onnx", None):  # streaming to a file, and all in memory
        with pytest.raises(ValueError) as info:
            quantize_model(path, output, weights="mxfp4")
        _one_line_error(info.value, pattern)
    assert list(out_dir.iterdir()) == []  # nothing written, not even a staging file
    assert _files(path.parent) == before  # input untouched


def test_model_readers_refuse_hostile_external_data(hostile_model: tuple[Path, str]) -> None:
    path, pattern = hostile_model
    with pytest.raises(ValueError) as info:
        ex.quantized_weights(path)
    _one_line_error(info.value, pattern)
    if runtime.has_custom_ops():
        with pytest.raises(ValueError) as info:
            runtime.session(path)
        _one_line_error(info.value, pattern)


def test_model_proto_external_data_stays_in_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ModelProto has no folder: its locations are relative to the working directory."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for model in (_model(str(_secret(tmp_path)), length=str(W_BYTES)), _model("../secret.bin")):
        with pytest.raises(ValueError, match=r"absolute|\.\."):
            quantize_model(model, weights="mxfp4")
        with pytest.raises(ValueError, match=r"absolute|\.\."):
            quantize_model(model, work / "q.onnx", weights="mxfp4")
        with pytest.raises(ValueError, match=r"absolute|\.\."):
            ex.quantized_weights(model)
    assert list(work.iterdir()) == []
    # The same reference inside the working directory is read (the checks refuse only escapes).
    data = np.arange(256, dtype=np.float32).reshape(W_SHAPE)
    (work / "w.data").write_bytes(data.tobytes())
    q = quantize_model(_model("w.data"), weights="mxfp4")
    assert not any(t.data_location == TensorProto.EXTERNAL for t in q.graph.initializer)


def test_good_external_data_still_loads(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    values = np.arange(256, dtype=np.float32)
    (folder / "sub" / "w.data").write_bytes(b"\0" * 64 + values.tobytes())
    (folder / "link.data").symlink_to(folder / "sub" / "w.data")  # a link that stays inside
    inline = _model("unused")
    inline.graph.initializer[0].CopyFrom(numpy_helper.from_array(values.reshape(W_SHAPE), "w"))
    want = {
        t.name: numpy_helper.to_array(t)
        for t in quantize_model(inline, weights="mxfp4").graph.initializer
    }
    for location in ("sub/w.data", "./sub/w.data", "link.data"):
        path = folder / "m.onnx"
        path.write_bytes(_model(location, "64", str(W_BYTES)).SerializeToString())
        q = quantize_model(path, weights="mxfp4")  # reads the declared range, past the 64 zeros
        got = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
        assert got.keys() == want.keys()
        assert all(np.array_equal(got[k], want[k]) for k in want)


# -- hostile manifests -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    w = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32), "w"
    )
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    q = quantize_model(model, weights="mxfp4", weight_storage="packed")
    folder = tmp_path_factory.mktemp("export") / "hw"
    ex.export(q, folder)
    return folder


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _manifest_case(mutate: Callable[[dict], object]) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        manifest = json.loads((folder / ex.MANIFEST).read_text())
        mutate(manifest)
        (folder / ex.MANIFEST).write_text(json.dumps(manifest))

    return apply


def _tensor(change: Callable[[dict], object]) -> Callable[[Path], None]:
    return _manifest_case(lambda m: change(m["tensors"][0]))


def _blob(key: str, value: object) -> Callable[[Path], None]:
    return _tensor(lambda t: t["blobs"]["elements"].__setitem__(key, value))


def _data_file(value: object, prepare: Callable[[Path], None] | None = None) -> Callable:
    def apply(folder: Path) -> None:
        if prepare is not None:
            prepare(folder)
        _manifest_case(lambda m: m.__setitem__("data_file", value))(folder)

    return apply


def _raw(text: str) -> Callable[[Path], None]:
    return lambda folder: (folder / ex.MANIFEST).write_text(text)


def _del(key: str) -> Callable[[dict], object]:
    return lambda d: d.pop(key)


def _set(key: str, value: object) -> Callable[[dict], object]:
    return lambda d: d.__setitem__(key, value)


ENTRY_FIELDS = (
    *("name", "shape", "tile_axis", "dtype", "layout", "rows", "row_length", "block_size"),
    *("blocks_per_row", "element_bits", "element_format", "blobs"),
)
MANIFEST_CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "data-absolute": (_data_file("/etc/passwd"), "absolute"),
    "data-dev-zero": (_data_file("/dev/zero"), "absolute"),
    "data-dev-urandom": (_data_file("/dev/urandom"), "absolute"),
    "data-dotdot": (_data_file("../weights.bin"), r"\.\."),
    "data-symlink-out": (
        _data_file("link.bin", lambda f: (f / "link.bin").symlink_to(f.parent / "secret.bin")),
        "leads out",
    ),
    "data-symlink-dev-urandom": (
        _data_file("link.bin", lambda f: (f / "link.bin").symlink_to("/dev/urandom")),
        "leads out",
    ),
    "data-fifo": (_data_file("pipe.bin", lambda f: os.mkfifo(f / "pipe.bin")), "not a regular"),
    "data-folder": (_data_file("sub", lambda f: (f / "sub").mkdir()), "not a regular"),
    "data-missing": (_data_file("nope.bin"), "missing"),
    "data-not-string": (_data_file(5), "non-empty relative path"),
    "manifest-fifo": (
        lambda f: ((f / ex.MANIFEST).unlink(), os.mkfifo(f / ex.MANIFEST)),
        "not a regular",
    ),
    "manifest-dev-urandom": (
        lambda f: ((f / ex.MANIFEST).unlink(), (f / ex.MANIFEST).symlink_to("/dev/urandom")),
        "not a regular",
    ),
    "not-json": (_raw("{"), "cannot read"),
    "binary": (lambda f: (f / ex.MANIFEST).write_bytes(b"\xff\xfe\x00"), "cannot read"),
    "deep-nesting": (_raw("[" * 200_000 + "]" * 200_000), "cannot read"),
    "a-list": (_raw("[]"), "must be a JSON object"),
    "null": (_raw("null"), "must be a JSON object"),
    "version-string": (_manifest_case(_set("manifest_version", "1")), "an integer"),
    "onnxq-version-number": (_manifest_case(_set("onnxq_version", 1)), "must be a string"),
    "tensors-missing": (_manifest_case(_del("tensors")), "'tensors' must be a list"),
    "tensors-dict": (_manifest_case(_set("tensors", {})), "'tensors' must be a list"),
    "tensor-not-object": (_manifest_case(_set("tensors", [3])), r"tensors\[0\] must be"),
    "duplicate-names": (
        _manifest_case(lambda m: m["tensors"].append(m["tensors"][0])),
        "appears twice",
    ),
    **{
        f"missing-{key}": (_tensor(_del(key)), repr(key) if key != "name" else "'name'")
        for key in ENTRY_FIELDS
    },
    "name-number": (_tensor(_set("name", 3)), "'name' must be a string"),
    "shape-string": (_tensor(_set("shape", "64x8")), "'shape'"),
    "shape-negative": (_tensor(_set("shape", [-64, -8])), "'shape'"),
    "shape-float": (_tensor(_set("shape", [64.0, 8])), "'shape'"),
    "shape-empty": (_tensor(_set("shape", [])), "'shape'"),
    "shape-huge": (_tensor(_set("shape", [2**62, 2**62])), "'rows' must be"),
    "shape-mismatch": (_tensor(_set("shape", [32, 16])), "'rows' must be"),
    "axis-out-of-range": (_tensor(_set("tile_axis", 2)), "'tile_axis'"),
    "axis-bool": (_tensor(_set("tile_axis", True)), "'tile_axis'"),
    "rows-string": (_tensor(_set("rows", "8")), "'rows' must be an integer"),
    "rows-negative": (_tensor(_set("rows", -8)), "'rows' must be an integer"),
    "block-wrong": (_tensor(_set("block_size", 16)), "'block_size' must be 32"),
    "dtype-unknown": (_tensor(_set("dtype", "nosuchformat")), "'dtype' is not an exportable"),
    "dtype-number": (_tensor(_set("dtype", 4)), "'dtype' must be"),
    "dtype-codebook": (_tensor(_set("dtype", "cb41_e2m2fnuz_e8m0_t8s4")), "not an exportable"),
    "dtype-other-layout": (_tensor(_set("dtype", "int8_e8m0_t16")), "'layout' must be"),
    "layout-unknown": (_tensor(_set("layout", "zip")), "'layout' must be"),
    "element-format": (_tensor(_set("element_format", "fp8_e4m3")), "'element_format'"),
    "blobs-list": (_tensor(_set("blobs", [])), "'blobs' must be"),
    "blob-missing": (_tensor(lambda t: t["blobs"].pop("scales")), "'blobs' must be"),
    "blob-extra": (_tensor(lambda t: t["blobs"].__setitem__("x", {})), "'blobs' must be"),
    "blob-not-object": (_tensor(lambda t: t["blobs"].__setitem__("scales", 1)), "'scales'"),
    "offset-negative": (_blob("offset", -64), "'offset' must be"),
    "offset-string": (_blob("offset", "0"), "'offset' must be"),
    "offset-float": (_blob("offset", 1e300), "'offset' must be"),
    "offset-huge": (_blob("offset", 2**80), "runs past the end"),
    "length-huge": (_blob("length", 2**80), "need"),
    "length-short": (_blob("length", 3), "need"),
    "length-missing": (_tensor(lambda t: t["blobs"]["elements"].pop("length")), "'length'"),
    "blob-dtype": (_blob("dtype", "float64"), "'dtype' must be 'uint8'"),
    "sha-missing": (_tensor(lambda t: t["blobs"]["elements"].pop("sha256")), "'sha256'"),
    "sha-number": (_blob("sha256", 5), "'sha256'"),
}


@pytest.mark.parametrize("case", sorted(MANIFEST_CASES))
def test_load_refuses_hostile_manifest(case: str, export_dir: Path, tmp_path: Path) -> None:
    folder = _copy(export_dir, tmp_path / "hw")
    (tmp_path / "secret.bin").write_bytes(SECRET)
    mutate, pattern = MANIFEST_CASES[case]
    mutate(folder)
    with pytest.raises(ex.LoadError) as info:
        ex.load(folder)
    _one_line_error(info.value, pattern)


def test_untouched_export_loads(export_dir: Path) -> None:
    loaded = ex.load(export_dir)
    assert list(loaded) == [
        t["name"] for t in json.loads((export_dir / "manifest.json").read_text())["tensors"]
    ]


def test_load_reads_only_declared_blobs(export_dir: Path, tmp_path: Path) -> None:
    """A data file far larger than its blobs is not read whole (only the declared ranges)."""
    folder = _copy(export_dir, tmp_path / "hw")
    with open(folder / ex.DATA_FILE, "ab") as f:
        f.truncate(f.tell() + (8 << 30))  # a sparse 8 GiB tail: reading it all would not fit
    loaded = ex.load(folder)
    assert loaded


# -- through the CLI ---------------------------------------------------------------------------
def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "onnxq", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
    )


def _refused(done: subprocess.CompletedProcess[str], pattern: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("onnxq: error:"), done.stderr
    assert "Traceback" not in done.stderr
    _one_line_error(ValueError(lines[0]), pattern)


CLI_CASES = ("absolute", "dotdot-deep", "symlink-out", "dev-urandom", "fifo", "length-overflow")


@pytest.mark.parametrize("case", CLI_CASES)
def test_cli_refuses_hostile_external_data(case: str, tmp_path: Path) -> None:
    build, pattern = MODEL_CASES[case]
    folder = tmp_path / "model"
    folder.mkdir()
    path = folder / "m.onnx"
    path.write_bytes(build(folder, tmp_path).SerializeToString())
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    done = _cli(
        "quantize", str(path), "-o", str(out_dir / "q.onnx"), "--weights", "mxfp4", cwd=tmp_path
    )
    _refused(done, pattern)
    assert list(out_dir.iterdir()) == []  # no output, no staging folder, no copied secret


def test_every_cli_command_refuses_hostile_external_data(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    path = folder / "m.onnx"
    path.write_bytes(_model(str(_secret(tmp_path)), length=str(W_BYTES)).SerializeToString())
    good = folder / "good.onnx"
    good.write_bytes(_model("w.data").SerializeToString())
    _good_data(folder)
    for args in (
        ("run", str(path)),
        ("inspect", str(path)),
        ("compare", str(good), str(path)),
        ("compare", str(path), str(good)),
        ("export", str(path), "-o", str(tmp_path / "hw")),
    ):
        _refused(_cli(*args, cwd=tmp_path), "absolute")
    assert not (tmp_path / "hw").exists()


def test_cli_accepts_contained_external_data(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    _good_data(folder)
    path = folder / "m.onnx"
    path.write_bytes(_model("w.data").SerializeToString())
    done = _cli(
        "quantize", str(path), "-o", str(tmp_path / "q.onnx"), "--weights", "mxfp4", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert onnx.load(str(tmp_path / "q.onnx")).graph.node


def test_quantize_checks_external_data_of_sparse_initializers(tmp_path: Path) -> None:
    """A sparse initializer's values are a TensorProto too: their location is checked."""
    secret = _secret(tmp_path)
    folder = tmp_path / "model"
    folder.mkdir()
    model = _model("w.bin", "0", str(4 * W_SHAPE[0] * W_SHAPE[1]))
    (folder / "w.bin").write_bytes(np.ones(W_SHAPE, np.float32).tobytes())
    values = TensorProto(name="s_values", data_type=TensorProto.FLOAT, dims=[2])
    values.data_location = TensorProto.EXTERNAL
    (folder / "link.bin").symlink_to(secret)  # inside by name, outside by target
    values.external_data.add(key="location", value="link.bin")
    values.external_data.add(key="offset", value="0")
    values.external_data.add(key="length", value="8")
    indices = helper.make_tensor("s_indices", TensorProto.INT64, [2], [0, 3])
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4]))
    path = folder / "m.onnx"
    onnx.save(model, path)
    with pytest.raises(ValueError) as info:
        quantize_model(path, tmp_path / "q.onnx", weights="mxfp4")
    _one_line_error(info.value, "symbolic link")
    assert not (tmp_path / "q.onnx").exists()
