"""Reading files that a model or a manifest names, without trusting the names.

A model's external-data ``location`` and an export manifest's ``data_file`` come from whoever
wrote the file. They must name a regular file inside the model's (or manifest's) folder after
symbolic links are resolved: no absolute path, no ``..``, no device, FIFO or folder. Declared
offsets and lengths must fit the file's actual size, checked before anything is read, and no
more than the declared bytes are ever read. Every refusal is a ``ValueError`` with a one-line
message; callers re-raise it as their own error type.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto

from onnxq.graph.walk import node_subgraphs

__all__ = [
    "ExternalRef",
    "all_tensors",
    "check_external",
    "contained_file",
    "external_ref",
    "load_external",
    "load_model",
    "open_regular",
    "read_array",
    "read_range",
]

_NUMBER = re.compile(r"[0-9]{1,20}")  # ASCII digits only: int() would take "1_0" and "٣"
_CHUNK = 64 << 20
# Bits per element of the types numpy has no itemsize for (packed sub-byte types).
_SUB_BYTE_BITS = {
    getattr(TensorProto, name): bits
    for name, bits in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2))
    if hasattr(TensorProto, name)
}


def contained_file(folder: Path, name: object, what: str) -> Path:
    """The path ``name`` gives inside ``folder``, symbolic links resolved.

    Args:
        folder: the folder the name is relative to (the model's or the manifest's).
        name: the path as the file wrote it.
        what: what names it, for messages (e.g. "external data location of tensor 'w'").

    Returns:
        The resolved path (not yet checked to be a regular file: `open_regular` does that).

    Raises:
        ValueError: not a non-empty string, absolute, with a ``..`` part or a NUL, or leading
            out of ``folder`` through a symbolic link.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} must be a non-empty relative path, got {name!r}")
    if "\0" in name:
        raise ValueError(f"{what} {name!r} holds a NUL character")
    posix, windows = PurePosixPath(name), PureWindowsPath(name)
    if posix.is_absolute() or windows.is_absolute() or windows.drive or name.startswith("\\"):
        raise ValueError(
            f"{what} {name!r} is an absolute path; it must be relative to {str(folder)!r}"
        )
    if ".." in posix.parts or ".." in windows.parts:
        raise ValueError(f"{what} {name!r} climbs out of its folder with '..'")
    root = folder.resolve()
    target = (root / name).resolve()
    if target != root and root not in target.parents:
        raise ValueError(f"{what} {name!r} leads out of {str(folder)!r} (through a symbolic link)")
    return target


def open_regular(path: Path, what: str) -> tuple[BinaryIO, int]:
    """Open ``path`` for reading if it is a regular file; returns the file and its size.

    The file is opened without blocking (a FIFO would block ``open``) and checked on the open
    descriptor, so a name swapped after a check cannot slip a device or FIFO in.

    Raises:
        ValueError: missing, unreadable, or not a regular file (device, FIFO, folder, socket).
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ValueError(f"{what}: {str(path)!r} is missing") from None
    except OSError as err:
        raise ValueError(f"{what}: cannot open {str(path)!r} ({err.strerror or err})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{what}: {str(path)!r} is not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), info.st_size
    except BaseException:
        os.close(fd)
        raise


def read_range(path: Path, offset: int, length: int, what: str) -> bytes:
    """Exactly ``length`` bytes of the regular file ``path`` from ``offset``.

    Raises:
        ValueError: not a regular file, or the range does not lie inside it.
    """
    f, size = open_regular(path, what)
    with f:
        _check_range(offset, length, size, what)
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:  # the file shrank since it was measured
        raise ValueError(f"{what}: {str(path)!r} ends early (truncated while reading?)")
    return data


def read_array(path: Path, offset: int, length: int, what: str) -> np.ndarray:
    """`read_range` into a writable uint8 array (no intermediate bytes object)."""
    f, size = open_regular(path, what)
    out = np.empty(0, np.uint8)
    with f:
        _check_range(offset, length, size, what)
        out = np.empty(length, np.uint8)
        f.seek(offset)
        got = f.readinto(memoryview(out))
    if got != length:
        raise ValueError(f"{what}: {str(path)!r} ends early (truncated while reading?)")
    return out


def _check_range(offset: int, length: int, size: int, what: str) -> None:
    if offset < 0 or length < 0 or offset > size or length > size - offset:
        raise ValueError(
            f"{what}: the file is too short: bytes {offset}..{offset + length} lie outside "
            f"its {size} bytes (truncated, or a wrong offset or length)"
        )


def all_tensors(model: onnx.ModelProto) -> Iterator[TensorProto]:
    """Every TensorProto that can hold a payload, in subgraphs and functions too."""

    def in_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[TensorProto]:
        for node in nodes:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("sparse_tensor"):
                    yield attr.sparse_tensor.values
                    yield attr.sparse_tensor.indices
                for sparse in attr.sparse_tensors:
                    yield sparse.values
                    yield sparse.indices
            for sub in node_subgraphs(node):
                yield from in_graph(sub)

    def in_graph(graph: onnx.GraphProto) -> Iterator[TensorProto]:
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        yield from in_nodes(graph.node)

    yield from in_graph(model.graph)
    for fn in model.functions:
        yield from in_nodes(fn.node)


@dataclasses.dataclass(frozen=True)
class ExternalRef:
    """A checked external-data reference: a regular file inside the folder, a range inside it."""

    path: Path
    offset: int
    length: int


def _expected_bytes(tensor: TensorProto) -> int | None:
    """Bytes the tensor's dims and type need, or None when the type has no fixed size."""
    if any(d < 0 for d in tensor.dims):
        raise ValueError(f"tensor {tensor.name!r} has a negative dimension {list(tensor.dims)}")
    count = math.prod(tensor.dims)
    bits = _SUB_BYTE_BITS.get(tensor.data_type)
    if bits is None:
        if tensor.data_type in (TensorProto.UNDEFINED, TensorProto.STRING):
            return None
        try:
            bits = 8 * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        except (KeyError, ValueError, TypeError):
            return None
    return (count * bits + 7) // 8


def external_ref(tensor: TensorProto, folder: Path) -> ExternalRef:
    """Check one external tensor's reference against ``folder`` and its file.

    Raises:
        ValueError: a missing, absolute or escaping location, a file that is not a regular
            file, an offset or length that is not a plain decimal number or that does not fit
            the file, or a length that does not match the tensor's dims and type.
    """
    what = f"external data of tensor {tensor.name!r}"
    info: dict[str, str] = {}
    for entry in tensor.external_data:
        info[entry.key] = entry.value
    if "location" not in info:
        raise ValueError(f"{what} has no location")
    path = contained_file(folder, info["location"], f"{what}: location")
    numbers: dict[str, int | None] = {}
    for key in ("offset", "length"):
        text = info.get(key)
        if text is None or text == "":
            numbers[key] = None
        elif _NUMBER.fullmatch(text):
            numbers[key] = int(text)
        else:
            raise ValueError(f"{what}: {key} {text!r} is not a non-negative decimal number")
    f, size = open_regular(path, what)
    f.close()
    offset = numbers["offset"] or 0
    length = numbers["length"]
    if length is None:
        length = size - offset
    _check_range(offset, length, size, what)
    expected = _expected_bytes(tensor)
    if expected is not None and expected != length:
        raise ValueError(
            f"{what} holds {length} bytes but its dims {list(tensor.dims)} need {expected}"
        )
    return ExternalRef(path, offset, length)


def check_external(model: onnx.ModelProto, folder: Path) -> None:
    """Check every external reference of ``model`` against ``folder`` (nothing is read).

    Raises:
        ValueError: the first bad reference (see `external_ref`).
    """
    for tensor in all_tensors(model):
        if tensor.data_location == TensorProto.EXTERNAL:
            external_ref(tensor, folder)


def load_external(model: onnx.ModelProto, folder: Path) -> None:
    """Read every external payload of ``model`` (in place), each checked first.

    Raises:
        ValueError: a bad reference (see `external_ref`).
    """
    for tensor in all_tensors(model):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        ref = external_ref(tensor, folder)
        data = read_range(ref.path, ref.offset, ref.length, f"external data of {tensor.name!r}")
        tensor.ClearField("external_data")
        tensor.data_location = TensorProto.DEFAULT
        tensor.raw_data = data


def load_model(path: str | os.PathLike[str], load_external_data: bool = True) -> onnx.ModelProto:
    """``onnx.load`` whose external data must stay inside the model's folder.

    Args:
        path: the .onnx file.
        load_external_data: read the payloads; False only checks every reference.

    Raises:
        ValueError: the model file is not a regular file or an external reference is bad.
        Anything ``onnx.load`` raises for a file that is not a model.
    """
    p = Path(path)
    f, _ = open_regular(p, "model")
    with f:
        model = onnx.load_model_from_string(f.read())
    if load_external_data:
        load_external(model, p.parent)
    else:
        check_external(model, p.parent)
    return model
