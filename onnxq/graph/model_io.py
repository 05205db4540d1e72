"""Model I/O for the graph pass: loading, external data, spilling payloads, atomic saving.

`load` reads the model to rewrite. With an output path, external data is not loaded: each
reference is checked (`onnxq._files.external_ref`) and made absolute, and tensors are read one
at a time (`tensor_values`) while the pass runs; new payloads wait on disk in a `Spill`, so
memory stays near the largest tensor's size. `finish` checks the result and writes it beside
the output so that a kill at any point is harmless (`save`, `onnxq._output`), with external
data when the input had it or the payload reaches `_EXTERNAL_BYTES`.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxq import _output
from onnxq._files import (
    all_tensors,
    external_ref,
    load_external,
    open_regular,
    read_array,
    read_range,
)
from onnxq.graph.schemas import DOMAIN
from onnxq.graph.walk import sort_nodes, trim_value_info, value_info_names

__all__ = [
    "SPILL_LOCATION",
    "Spill",
    "finish",
    "is_external",
    "load",
    "restore",
    "save",
    "stripped",
    "tensor_values",
    "to_opset",
]

OPSET = 21  # the function fallbacks are written in ai.onnx opset 21
_TWO_GB = 2**31 - 1
_STRIP_BYTES = 1 << 20  # initializers above this leave the model during shape inference
_EXTERNAL_BYTES = _TWO_GB // 2  # payloads from this size are saved with external data
_EXTERNAL_MIN = 1024  # with external data, tensors from this size go to the data file
_INLINE_BYTES = 1 << 16  # external tensors up to this size are loaded with the graph
_PARK_BYTES = 1 << 16  # while rewriting, new payloads above this wait on disk (Spill)
_CHUNK = 64 << 20  # copy external payloads this much at a time
SPILL_LOCATION = "<onnxq spill>"  # the location of a payload parked in the Spill


@contextlib.contextmanager
def stripped(model: onnx.ModelProto) -> Iterator[dict[str, bytes]]:
    """Move large initializer payloads out while the model is serialized (2 GB protobuf limit)."""
    stash: dict[str, bytes] = {}
    for t in model.graph.initializer:
        if len(t.raw_data) > _STRIP_BYTES:
            stash[t.name] = t.raw_data
            t.ClearField("raw_data")
    try:
        yield stash
    finally:
        restore(model, stash)


def restore(model: onnx.ModelProto, stash: Mapping[str, bytes]) -> None:
    """Put the payloads `stripped` took out back into ``model``'s initializers."""
    for t in model.graph.initializer:
        if t.name in stash and not t.raw_data:
            t.raw_data = stash[t.name]


def load(
    model: str | os.PathLike[str] | onnx.ModelProto, output: Path | None = None
) -> tuple[onnx.ModelProto, Spill | None]:
    """The model to rewrite, and the spill that keeps its payloads on disk (None: in memory).

    With an ``output`` the external data of a model path is not loaded: tensors over
    ``_INLINE_BYTES`` keep their references (made absolute) and are read one at a time when
    quantized or copied into the output, so memory stays bounded. Without one the returned
    model must hold everything, so external data is loaded as before.
    """
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        # A ModelProto has no folder: its external locations are relative to the working
        # directory (as onnxruntime reads them), and must stay inside it.
        base, loaded = Path.cwd(), copy
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise ValueError(f"model {str(path)!r} does not exist or is not a file")
        try:
            loaded = onnx.load(path, load_external_data=False)
        except Exception as err:
            raise ValueError(f"model {str(path)!r} is not a readable ONNX model: {err}") from None
        base = path.parent
    else:
        raise TypeError(f"model must be a path or an onnx.ModelProto, not {type(model).__name__}")
    sort_nodes(loaded.graph)  # onnxruntime runs unsorted graphs; onnx.checker refuses them
    if output is None:
        load_external(loaded, base)
        return loaded, None
    spill = Spill(output.parent)
    _resolve_external(loaded, base, spill)
    return loaded, spill


class Spill:
    """Payloads parked on disk while the model is rewritten (one weight in memory at a time).

    An anonymous temporary file (no name left behind, even if the process dies) in the output
    folder; tensors parked there refer to it by the location ``SPILL_LOCATION``.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.file: Any = None
        self.had_external = False  # the input had external data: the output keeps it

    def _handle(self) -> Any:
        if self.file is None:
            where = self.folder if str(self.folder) and self.folder.is_dir() else None
            self.file = tempfile.TemporaryFile(dir=where)
        return self.file

    def put(self, tensor: TensorProto, data: np.ndarray | bytes) -> None:
        """Write ``data`` (the tensor's little-endian raw bytes) and point ``tensor`` at it."""
        f = self._handle()
        f.seek(0, os.SEEK_END)
        view = memoryview(data).cast("B") if isinstance(data, np.ndarray) else memoryview(data)
        offset = _aligned(f.tell(), view.nbytes)
        f.seek(offset)
        f.write(view)
        _point(tensor, SPILL_LOCATION, offset, view.nbytes)

    def park(self, tensor: TensorProto) -> None:
        """Move a large raw_data payload out of ``tensor`` into the spill."""
        if tensor.data_location != TensorProto.EXTERNAL and tensor.HasField("raw_data"):
            data = tensor.raw_data
            if len(data) > _PARK_BYTES:
                self.put(tensor, data)

    def set_values(self, tensor: TensorProto, values: np.ndarray) -> None:
        """Replace ``tensor``'s values (same name) by ``values``, parked on disk."""
        values = np.ascontiguousarray(values)
        if values.dtype.byteorder == ">" or values.dtype not in _RAW_DTYPES:
            tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
            self.park(tensor)
            return
        tensor.data_type = helper.np_dtype_to_tensor_dtype(values.dtype)
        del tensor.dims[:]
        tensor.dims.extend(values.shape)
        self.put(tensor, values)

    def read(self, offset: int, length: int) -> np.ndarray:
        """``length`` bytes of the spill from ``offset`` (uint8)."""
        f = self._handle()
        f.flush()
        out = np.empty(length, np.uint8)
        f.seek(offset)
        if f.readinto(memoryview(out)) != length:
            raise ValueError("the spill file is shorter than expected")
        return out

    def close(self) -> None:
        """Close (and so delete) the spill file."""
        if self.file is not None:
            self.file.close()
            self.file = None


_RAW_NAMES = "float32 float16 float64 uint8 int8 uint16 int16 uint32 int32 int64"
_RAW_DTYPES = tuple(np.dtype(d) for d in _RAW_NAMES.split())


def _aligned(position: int, size: int | None) -> int:
    """Large payloads start on a page (onnxruntime can map them), small ones on 64 bytes."""
    step = 4096 if size is None or size >= _STRIP_BYTES else 64
    return position + (-position % step)


def is_external(tensor: TensorProto) -> bool:
    """True when the tensor's payload is in a file (external data or the spill)."""
    return tensor.data_location == TensorProto.EXTERNAL


def _external_info(tensor: TensorProto) -> tuple[str, int, int | None]:
    info = {e.key: e.value for e in tensor.external_data}
    if "location" not in info:
        raise ValueError(f"tensor {tensor.name!r} has external data without a location")
    length = int(info["length"]) if info.get("length") else None
    return info["location"], int(info.get("offset") or 0), length


_VALUE_FIELDS = (
    "raw_data",
    "float_data",
    "int32_data",
    "int64_data",
    "double_data",
    "uint64_data",
    "external_data",
)


def _point(tensor: TensorProto, location: str, offset: int, length: int) -> None:
    for field in _VALUE_FIELDS:
        tensor.ClearField(field)
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        tensor.external_data.add(key=key, value=value)


def _resolve_external(model: onnx.ModelProto, base: Path, spill: Spill) -> None:
    """Check every external reference against its file and make its location absolute.

    Locations must name regular files inside ``base`` and ranges inside them (`external_ref`).
    Tensors are read later, one at a time; small ones are loaded now (shape inference may
    read them).
    """
    for tensor in all_tensors(model):
        if not is_external(tensor):
            continue
        spill.had_external = True
        ref = external_ref(tensor, base)
        if ref.length <= _INLINE_BYTES:
            data = read_range(ref.path, ref.offset, ref.length, f"external data of {tensor.name!r}")
            tensor.ClearField("external_data")
            tensor.data_location = TensorProto.DEFAULT
            tensor.raw_data = data
        else:
            _point(tensor, str(ref.path), ref.offset, ref.length)


def _external_bytes(tensor: TensorProto, spill: Spill | None) -> np.ndarray:
    """One external tensor's bytes (uint8), read from the spill or its data file."""
    location, offset, length = _external_info(tensor)
    if location == SPILL_LOCATION:
        if spill is None or length is None:
            raise ValueError(f"tensor {tensor.name!r} refers to a spill that is gone")
        return spill.read(offset, length)
    if length is None or not Path(location).is_absolute():  # `_resolve_external` sets both
        raise ValueError(f"external data of {tensor.name!r} was not checked before reading")
    return read_array(Path(location), offset, length, f"external data of {tensor.name!r}")


def tensor_values(tensor: TensorProto, spill: Spill | None) -> np.ndarray:
    """A tensor's values; an external payload is read now, this tensor only."""
    if not is_external(tensor):
        return numpy_helper.to_array(tensor)
    data = _external_bytes(tensor, spill)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    if dtype in _RAW_DTYPES:
        return data.view(dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(tensor.dims)
    inline = TensorProto(name=tensor.name, dims=tensor.dims, data_type=tensor.data_type)
    inline.raw_data = data.tobytes()
    del data
    return numpy_helper.to_array(inline)


def _payload(model: onnx.ModelProto) -> int:
    """Bytes of tensor payload, held or external (decides external-data saving)."""
    total = 0
    for t in all_tensors(model):
        if is_external(t):
            length = _external_info(t)[2]
            total += length if length is not None else 0
        else:
            total += len(t.raw_data)
    return total


def _copy_payload(tensor: TensorProto, spill: Spill | None, out: Any) -> None:
    """Append ``tensor``'s external payload to ``out`` in chunks (never all in memory)."""
    location, offset, length = _external_info(tensor)
    if location == SPILL_LOCATION:
        assert spill is not None and spill.file is not None and length is not None
        spill.file.flush()
        src, close = spill.file, False
    else:
        if length is None or not Path(location).is_absolute():  # `_resolve_external` sets both
            raise ValueError(f"external data of {tensor.name!r} was not checked before copying")
        src, size = open_regular(Path(location), f"external data of {tensor.name!r}")
        close = True
        if offset + length > size:
            src.close()
            raise ValueError(f"external data of {tensor.name!r} ends early (truncated?)")
    try:
        src.seek(offset)
        left = length
        while left:
            chunk = src.read(min(left, _CHUNK))
            if not chunk:
                raise ValueError(f"external data of {tensor.name!r} ends early")
            out.write(chunk)
            left -= len(chunk)
    finally:
        if close:
            src.close()
    return None


_DATA_MAGIC = b"onnxq external data v1\n".ljust(64, b"\0")  # marks data files onnxq wrote


def save(
    model: onnx.ModelProto, output: Path, spill: Spill | None = None, source: Path | None = None
) -> None:
    """Check the model and write it beside ``output`` so that a kill at any point is harmless.

    External data (when the input had it or the payload reaches ``_EXTERNAL_BYTES``) goes to
    a data file under a name that does not exist yet - ``{output.name}.data``, else
    ``{output.name}.{8 hex}.data`` - written tensor by tensor (parked and input payloads
    copied in chunks). Order: data file complete under its new name, then the model renamed
    onto ``output`` (the commit), then the data files no model refers to any more are removed
    (`_remove_stale_data`). A kill before the commit leaves the old model with its old data; a
    kill after it, the new model with its new data; temporary files and orphaned data are
    removed by the next run (`onnxq._output`). Otherwise one file, parked payloads read back.
    """
    folder = output.parent if str(output.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"output folder {str(folder)!r} does not exist")
    external = (spill is not None and spill.had_external) or _payload(model) >= _EXTERNAL_BYTES
    if not external:
        for t in all_tensors(model):  # bring parked payloads back: one self-contained file
            if is_external(t):
                data = _external_bytes(t, spill).tobytes()
                t.ClearField("external_data")
                t.data_location = TensorProto.DEFAULT
                t.raw_data = data
        onnx.checker.check_model(model, full_check=True)
    _output.sweep(folder)
    # The data files of the model about to be replaced may be removed after the commit.
    replaced = _referenced(output) if output.exists() and _data_files(output) else set()
    data_path: Path | None = None
    try:
        with contextlib.ExitStack() as stack:
            if external:
                data_target = folder / f"{output.name}.data"
                out, data_tmp = stack.enter_context(_output.new_file(data_target))
                out.write(_DATA_MAGIC)
                refs: list[TensorProto] = []
                for t in all_tensors(model):
                    data = b"" if is_external(t) else t.raw_data
                    if not is_external(t) and len(data) < _EXTERNAL_MIN:
                        continue
                    size = _external_info(t)[2] if is_external(t) else len(data)
                    start = _aligned(out.tell(), size)
                    out.seek(start)
                    if is_external(t):
                        _copy_payload(t, spill, out)
                    else:
                        out.write(data)
                    del data
                    refs.append(t)
                    _point(t, "", start, out.tell() - start)
                out.flush()
                data_path = _publish_new(data_tmp, output)
                for t in refs:  # point the references at the data file's final name
                    for entry in t.external_data:
                        if entry.key == "location":
                            entry.value = data_path.name
            f, tmp = stack.enter_context(_output.new_file(output))
            f.write(model.SerializeToString())
            f.flush()
            if external:
                onnx.checker.check_model(str(tmp), full_check=True)
            _output.replace(tmp, output)  # the commit
            data_path = None
    except BaseException:
        if data_path is not None:  # published but never referenced by a committed model
            with contextlib.suppress(OSError):
                os.unlink(data_path)
        raise
    finally:
        if spill is not None:
            spill.close()
    _remove_stale_data(output, source, replaced)


def _publish_new(temp: Path, output: Path) -> Path:
    """Give a finished data file a name beside ``output`` that no file has; return it.

    ``os.link`` fails rather than replace, so an existing data file (the old model's, or the
    input's) is never overwritten.
    """
    for k in range(100):
        name = f"{output.name}.data" if k == 0 else f"{output.name}.{secrets.token_hex(4)}.data"
        final = temp.parent / name
        try:
            os.link(temp, final)
        except FileExistsError:
            continue
        except OSError:  # no hard links on this filesystem
            if final.exists():
                continue
            os.replace(temp, final)
            return final
        os.unlink(temp)
        return final
    raise ValueError(f"no free data file name beside {str(output)!r}")


def _referenced(model_path: Path) -> set[str]:
    """The external data locations a model file refers to (empty when unreadable)."""
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception:
        return set()
    return {e.value for t in all_tensors(model) if is_external(t) for e in _locations(t)}


def _locations(tensor: TensorProto) -> list[onnx.StringStringEntryProto]:
    """The ``location`` entries of an external tensor's references."""
    return [e for e in tensor.external_data if e.key == "location"]


def _data_files(output: Path) -> list[Path]:
    """Files beside ``output`` named like its data files: ``{name}.data``, ``{name}.{hex}.data``."""
    folder = output.parent if str(output.parent) else Path(".")
    names = re.compile(re.escape(output.name) + r"(\.[0-9a-f]{8})?\.data")
    with contextlib.suppress(OSError):
        found = [p for p in folder.iterdir() if names.fullmatch(p.name)]
        return [p for p in found if p.is_file() and not p.is_symlink()]
    return []


def _remove_stale_data(output: Path, source: Path | None, replaced: set[str]) -> None:
    """Remove the data files of ``output`` that no model uses any more.

    Candidates (`_data_files`) are those the replaced model referred to (``replaced``) and
    those onnxq wrote (they start with ``_DATA_MAGIC``: orphans of a run killed after its
    commit); other files are never touched. They stay when the model at ``output`` or the
    input model refers to them, or while another run holds them (`onnxq._output.locked`).
    """
    candidates = []
    for path in _data_files(output):
        with contextlib.suppress(OSError), open(path, "rb") as f:
            if path.name in replaced or f.read(len(_DATA_MAGIC)) == _DATA_MAGIC:
                candidates.append(path)
    if not candidates:
        return
    keep = _referenced(output)
    if source is not None and source.exists() and not _same_path(source, output):
        keep |= {str((source.parent / v).resolve()) for v in _referenced(source)}
    for path in candidates:
        if path.name in keep or str(path.resolve()) in keep or _output.locked(path):
            continue
        with contextlib.suppress(OSError):
            os.unlink(path)


def _same_path(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def to_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """Bring ai.onnx to opset 21 (the function fallbacks' opset) and import the onnxq domain."""
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if version is not None and version < OPSET:
        from onnx import version_converter

        with stripped(model) as stash:
            try:
                converted = version_converter.convert_version(model, OPSET)
            except Exception as err:
                raise ValueError(
                    f"the model's ai.onnx opset {version} could not be converted to opset "
                    f"{OPSET}, which the onnxq function fallbacks use: {err}"
                ) from None
            restore(converted, stash)
        trim_value_info(converted, value_info_names(model), DOMAIN)  # the converter's inference
        model = converted
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return model


CHECK_ERRORS = (onnx.checker.ValidationError, onnx.shape_inference.InferenceError)


def invalid(err: Exception) -> str:
    """The message for a quantized model that onnx.checker refuses."""
    return (
        f"the quantized model fails onnx.checker ({' '.join(str(err).split())[:300]}); the "
        "input model is probably not valid ONNX: check it with onnx.checker.check_model"
    )


def finish(
    model: onnx.ModelProto, output: Path | None, spill: Spill | None, source: Path | None
) -> None:
    """Check the quantized model and write it to ``output`` (when given).

    Raises:
        ValueError: onnx.checker refuses the model (a model too large to serialize is checked
            when written, or not at all without an output).
    """
    if output is not None:
        try:  # checks the model before anything is renamed into place
            save(model, output, spill, source)
        except CHECK_ERRORS as err:
            raise ValueError(invalid(err)) from None
    elif _payload(model) < _EXTERNAL_BYTES:
        try:
            onnx.checker.check_model(model, full_check=True)
        except CHECK_ERRORS as err:
            raise ValueError(invalid(err)) from None
