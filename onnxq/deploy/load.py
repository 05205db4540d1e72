"""Reading an export folder back: the manifest checked field by field, blobs hashed, decoded."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from onnxq._files import contained_file, open_regular
from onnxq.cast.api import QTensor
from onnxq.cast.packing import code_dtype
from onnxq.deploy.layouts import (
    _OCP_FLOATS,
    DATA_FILE,
    MANIFEST,
    MANIFEST_VERSION,
    _decode_bfp,
    _decode_mx,
    _decode_ocp,
    _unrows,
    layout_of,
)
from onnxq.formats.datatype import datatype
from onnxq.formats.modes import CastMode

__all__ = ["LoadError", "load"]


class LoadError(ValueError):
    """An export folder cannot be read (missing or corrupted file, newer onnxq version)."""


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])


def load(out_dir: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Read an `export` folder back into arrays.

    The manifest is not trusted: its ``data_file`` must be a regular file inside the folder
    (symbolic links resolved), every field must have its type and a value consistent with the
    tensor's format and shape, and every blob must lie inside the data file; only the
    declared blobs are read.

    Args:
        out_dir: the folder holding ``manifest.json`` and ``weights.bin``.

    Returns:
        Tensor name -> dict with ``manifest`` (its manifest entry), ``blobs`` (the raw blobs,
        int8/uint8), the layout's fields (``exponents``/``mantissas`` for ``bfp-int8``,
        ``records``/``exponents``/``shifts`` for ``mx-record``, ``codes``/``scales`` for all),
        ``values`` (float32 of the entry's ``shape``, decoded from the layout alone; a weight
        tiled as a matrix has ``weight_shape`` too, which ``values`` reshapes to) and
        ``qtensor`` (an ``actual``-mode `QTensor`; ``onnxq.upcast`` of it equals the model's
        dequantized weight bit for bit).

    Raises:
        LoadError: a missing or unreadable manifest or data file, a manifest from a newer
            onnxq, a malformed manifest (missing or mistyped field, a ``data_file`` outside
            the folder or not a regular file, sizes that do not match the format and shape),
            a blob outside the data file or whose sha256 does not match.
    """
    from onnxq._version import __version__

    folder = Path(out_dir)
    path = folder / MANIFEST
    try:
        f, _ = open_regular(path, f"{MANIFEST} of {str(folder)!r}")
    except ValueError as err:
        if not path.exists() and not path.is_symlink():
            raise LoadError(f"{str(folder)!r} has no {MANIFEST}: not an onnxq export") from None
        raise LoadError(str(err)) from None
    try:
        with f:
            manifest = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise LoadError(f"cannot read {str(path)!r}: {_one_line(err)}") from None
    where = str(path)
    if not isinstance(manifest, dict):
        raise LoadError(f"{where}: the manifest must be a JSON object, not {_kind(manifest)}")
    written = manifest.get("onnxq_version", "0")
    version = manifest.get("manifest_version", 0)
    if not isinstance(written, str) or not _is_int(version):
        raise LoadError(
            f"{where}: 'onnxq_version' must be a string and 'manifest_version' an integer"
        )
    if _version_tuple(written) > _version_tuple(__version__) or version > MANIFEST_VERSION:
        raise LoadError(
            f"{str(path)!r} was written by onnxq {written} (manifest version "
            f"{version}), newer than this onnxq "
            f"{__version__}; upgrade onnxq to read it"
        )
    tensors = manifest.get("tensors")
    if not isinstance(tensors, list):
        raise LoadError(f"{where}: 'tensors' must be a list, not {_kind(tensors)}")
    entries = [_checked_entry(entry, i, where) for i, entry in enumerate(tensors)]
    names = [e["name"] for e in entries]
    if len(set(names)) != len(names):
        raise LoadError(f"{where}: a tensor name appears twice")
    try:
        data_path = contained_file(folder, manifest.get("data_file", DATA_FILE), "'data_file'")
        data, size = open_regular(data_path, f"{where}: 'data_file'")
    except ValueError as err:
        raise LoadError(f"{where}: {_one_line(err)}") from None
    result: dict[str, dict[str, Any]] = {}
    with data:
        for entry, blob_sizes in _blob_sizes(entries):
            name = entry["name"]
            blobs: dict[str, np.ndarray] = {}
            for key, (dtype, expected) in blob_sizes.items():
                info = entry["blobs"][key]
                start, length = info["offset"], info["length"]
                if length != expected:
                    raise LoadError(
                        f"blob {key!r} of {name!r} holds {length} bytes but its shape and format "
                        f"need {expected} ({MANIFEST} is inconsistent)"
                    )
                if start + length > size:
                    raise LoadError(
                        f"blob {key!r} of {name!r} runs past the end of {data_path.name} "
                        "(truncated file)"
                    )
                data.seek(start)
                raw = data.read(length)
                if len(raw) != length:
                    raise LoadError(f"{data_path.name} ends early (truncated while reading)")
                if hashlib.sha256(raw).hexdigest() != info["sha256"]:
                    raise LoadError(
                        f"blob {key!r} of {name!r} is corrupted: its sha256 does not match "
                        f"{MANIFEST} (export it again)"
                    )
                blobs[key] = np.frombuffer(raw, dtype=np.dtype(dtype)).copy()
            result[name] = _decoded(entry, blobs)
    return result


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_SHA256 = re.compile(r"[0-9a-f]{64}")
_BLOB_DTYPES = {  # layout -> blob key -> the dtype `export` writes it with
    "bfp-int8": {"packed": "int8"},
    "mx-record": {"records": "uint8"},
    "ocp-mx": {"elements": "uint8", "scales": "uint8"},
}


def _checked_entry(entry: object, index: int, where: str) -> dict[str, Any]:
    """One manifest tensor entry, every field the decoders use checked against its format."""
    if not isinstance(entry, dict):
        raise LoadError(f"{where}: tensors[{index}] must be an object, not {_kind(entry)}")
    name = entry.get("name")
    label = f"{where}: tensor {name!r}" if isinstance(name, str) else f"{where}: tensors[{index}]"
    if not isinstance(name, str):
        raise LoadError(f"{label}: 'name' must be a string")

    def bad(field: str, why: str) -> LoadError:
        return LoadError(f"{label}: {field!r} {why}")

    def whole(field: str, low: int = 0) -> int:
        value = entry.get(field)
        if not _is_int(value) or value < low:
            raise bad(field, f"must be an integer >= {low}, got {value!r}")
        return value

    shape = entry.get("shape")
    if not isinstance(shape, list) or not shape or not all(_is_int(d) and d > 0 for d in shape):
        raise bad("shape", f"must be a non-empty list of positive integers, got {shape!r}")
    axis = entry.get("tile_axis")
    if not _is_int(axis) or not 0 <= axis < len(shape):
        raise bad("tile_axis", f"must be an axis of shape {shape}, got {axis!r}")
    restored = entry.get("weight_shape", shape)  # tiled as a matrix, reshaped by the reader
    if (
        not isinstance(restored, list)
        or not all(_is_int(d) and d > 0 for d in restored)
        or math.prod(restored) != math.prod(shape)
    ):
        raise bad("weight_shape", f"must be positive integers with {math.prod(shape)} values")
    code = entry.get("dtype")
    if not isinstance(code, str):
        raise bad("dtype", f"must be a data type code string, got {code!r}")
    try:
        dt = datatype(code)
        layout = layout_of(dt)
    except (ValueError, TypeError, OverflowError) as err:
        raise bad("dtype", f"is not an exportable format ({_one_line(err)})") from None
    if entry.get("layout") != layout:
        raise bad("layout", f"must be {layout!r} for dtype {code!r}, got {entry.get('layout')!r}")
    assert dt.sspec is not None
    block, bits = dt.sspec.tiles[0].size, dt.nspec.bits
    length = shape[axis]
    rows = math.prod(shape) // length
    expected = {
        "rows": rows,
        "row_length": length,
        "block_size": block,
        "blocks_per_row": -(-length // block),
        "element_bits": bits,
    }
    if layout == "bfp-int8":
        expected["mantissa_bits"] = bits
    for field, value in expected.items():
        if whole(field) != value:
            raise bad(field, f"must be {value} for dtype {code!r} and shape {shape}")
    if layout == "ocp-mx":
        fmt = _OCP_FLOATS.get(str(dt.nspec), "int8")
        if entry.get("element_format") != fmt:
            raise bad("element_format", f"must be {fmt!r} for dtype {code!r}")
    blobs = entry.get("blobs")
    wanted = _BLOB_DTYPES[layout]
    if not isinstance(blobs, dict) or set(blobs) != set(wanted):
        raise bad("blobs", f"must be an object with the blobs {sorted(wanted)}")
    for key, info in blobs.items():
        if not isinstance(info, dict):
            raise bad("blobs", f"entry {key!r} must be an object")
        for field in ("offset", "length"):
            value = info.get(field)
            if not _is_int(value) or value < 0:
                raise bad("blobs", f"{key!r}: {field!r} must be an integer >= 0, got {value!r}")
        if info.get("dtype", wanted[key]) != wanted[key]:
            raise bad("blobs", f"{key!r}: 'dtype' must be {wanted[key]!r}")
        if not isinstance(info.get("sha256"), str) or not _SHA256.fullmatch(info["sha256"]):
            raise bad("blobs", f"{key!r}: 'sha256' must be 64 lowercase hex digits")
    return entry


def _blob_sizes(
    entries: list[dict[str, Any]],
) -> Iterator[tuple[dict[str, Any], dict[str, tuple[str, int]]]]:
    """Each checked entry with its blobs' dtype and the byte length its geometry needs."""
    for entry in entries:
        rows, blocks, block = entry["rows"], entry["blocks_per_row"], entry["block_size"]
        bits = entry["element_bits"]
        layout = entry["layout"]
        if layout == "bfp-int8":
            sizes = {"packed": ("int8", rows * blocks * (1 + block))}
        elif layout == "mx-record":
            sizes = {"records": ("uint8", rows * blocks * ((16 + 16 * bits) // 8))}
        else:
            sizes = {
                "elements": ("uint8", (rows * blocks * block * bits + 7) // 8),
                "scales": ("uint8", rows * blocks),
            }
        yield entry, sizes


def _decoded(entry: dict[str, Any], blobs: dict[str, np.ndarray]) -> dict[str, Any]:
    layout = entry["layout"]
    if layout == "bfp-int8":
        fields = _decode_bfp(entry, blobs["packed"])
    elif layout == "mx-record":
        fields = _decode_mx(entry, blobs["records"])
    elif layout == "ocp-mx":
        fields = _decode_ocp(entry, blobs["elements"], blobs["scales"])
    else:
        raise LoadError(f"tensor {entry['name']!r} has an unknown layout {layout!r}")
    shape = tuple(entry["shape"])
    axis = int(entry["tile_axis"])
    length = entry["row_length"]
    dt = datatype(entry["dtype"])
    meta = None
    if layout == "mx-record":
        pairs = -(-length // 2)
        meta = _unrows(fields["shifts"][:, :pairs], shape, axis).astype(np.uint8)
    codes = fields["codes"][:, :length]
    qtensor = QTensor(
        data=_unrows(codes, shape, axis).astype(code_dtype(dt.nspec.bits)),
        dtype=dt,
        shape=shape,
        axis=axis,
        mode=CastMode.ACTUAL,
        scale=_unrows(fields["scales"], shape, axis).astype(np.uint8),
        meta=meta,
    )
    out: dict[str, Any] = {"manifest": entry, "blobs": blobs, **fields}
    out["codes"] = qtensor.data
    out["values"] = np.ascontiguousarray(_unrows(fields["values"][:, :length], shape, axis))
    out["qtensor"] = qtensor
    return out
