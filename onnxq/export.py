"""Quantized weights in the layouts hardware reads: `export` a packed model, `load` it back.

`export(model, out_dir)` writes every weight that a ``DequantizeMX`` node of a packed model
dequantizes from stored codes (``onnxq quantize --storage packed``) into ``out_dir/weights.bin``
and describes it in ``out_dir/manifest.json``. Blocks always run along the weight's tile axis:
the axis is moved last, the tensor is seen as ``rows x row_length`` (C order), and every row
is cut into ``blocks_per_row`` blocks; blocks are stored row by row. A ragged last block of a
row is padded with zero codes (``padded: true`` in the manifest). The layouts
(``docs/layouts.md`` has them bit by bit, with a worked example):

- ``bfp-int8`` (BFP16 ``int8_e8m0_t16``, its block-8 variant, BFP8 ``int4_e8m0_t32``: int
  elements with an E8M0 scale and no subtile, except MXINT8): the BFP document's int8 layout
  ``[exponents..., mantissas...]`` of `onnxq.bfp`, one int8 shared exponent per block
  (``E8M0 code - 126``) then one sign-extended int8 mantissa per value; value =
  ``mantissa * 2^(shared_exp - (bits - 1))``.
- ``mx-record`` (MX9/MX6/MX4): one record per 16-value block, packed least-significant bit
  first: the 8-bit E8M0 code, 8 one-bit pair shifts, 16 sign-magnitude elements of ``m + 1``
  bits (m = 7, 4, 2): 18, 12 and 8 bytes per block.
- ``ocp-mx`` (MXFP8 E4M3/E5M2, MXFP6 E2M3/E3M2, MXFP4 E2M1, MXINT8): element codes packed
  as the OCP MX specification describes (8-bit one per byte, FP6 four per 3 bytes LSB first,
  FP4 two per byte low nibble first) in one blob, and one E8M0 scale byte per block in
  another.

The manifest records each tensor's name, shape, tile axis, format, layout, geometry and, per
blob, its byte offset and length in ``weights.bin`` (64-byte aligned) and sha256, plus the
onnxq version that wrote it. `load(out_dir)` checks the hashes and the version and decodes
every tensor back to its codes, a `QTensor` (``onnxq.upcast`` gives the model's dequantized
weight bit for bit) and float32 values computed from the layout alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from onnxq import _output
from onnxq._files import all_tensors, contained_file, load_external, load_model, open_regular
from onnxq.cast.api import QTensor
from onnxq.cast.packing import code_dtype, pack_bits, unpack_bits
from onnxq.formats.datatype import DataType, datatype, datatypes
from onnxq.formats.modes import CastMode
from onnxq.graph.walk import stored_tensors, walk_graphs

__all__ = [
    "DATA_FILE",
    "MANIFEST",
    "MANIFEST_VERSION",
    "ExportError",
    "LoadError",
    "decode_mx_records",
    "export",
    "layout_of",
    "load",
    "quantized_weights",
]

MANIFEST = "manifest.json"
DATA_FILE = "weights.bin"
MANIFEST_VERSION = 1
_ALIGN = 64
_OCP_FLOATS = {  # onnxq code -> OCP element name
    "e4m3fn": "fp8_e4m3",
    "e5m2": "fp8_e5m2",
    "e2m3fnuz": "fp6_e2m3",
    "e3m2fnuz": "fp6_e3m2",
    "e2m1fnuz": "fp4_e2m1",
}
_MX_BITS = (8, 5, 3)  # MX9, MX6, MX4 element widths (m + 1)


class ExportError(ValueError):
    """The model cannot be exported (no quantized weights, no hardware layout, folder in use)."""


class LoadError(ValueError):
    """An export folder cannot be read (missing or corrupted file, newer onnxq version)."""


# -- finding the quantized weights -----------------------------------------------------------
def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    values = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}


def _find(model: onnx.ModelProto) -> tuple[dict[str, QTensor], list[tuple[str, str]]]:
    """DequantizeMX weights as compress-mode QTensors, and other stored quantized tensors."""
    stored = stored_tensors(model)
    found: dict[str, QTensor] = {}
    others: list[tuple[str, str]] = []
    for graph in walk_graphs(model.graph):
        for node in graph.node:
            if node.domain != "onnxq" or not node.input or node.input[0] not in stored:
                continue
            attrs = _attrs(node)
            if node.op_type == "CodebookLookup":
                others.append((node.output[0], str(attrs.get("dtype", "?"))))
                continue
            if node.op_type != "DequantizeMX":
                continue
            arrays: list[np.ndarray | None] = []
            for i in range(6):
                name = node.input[i] if i < len(node.input) else ""
                if name and name not in stored:  # computed, not stored: not a weight
                    break
                arrays.append(numpy_helper.to_array(stored[name]) if name else None)
            else:
                dt = datatype(str(attrs["dtype"]))
                shape = tuple(int(d) for d in attrs["shape"])
                q_arr, scale, zero, tenscale, meta, mask = arrays
                assert q_arr is not None
                found[node.output[0]] = QTensor(
                    data=q_arr.reshape(-1),
                    dtype=dt,
                    shape=shape,
                    axis=int(attrs.get("axis", -1)) % len(shape),
                    mode=CastMode.COMPRESS,
                    scale=scale,
                    zero=zero,
                    tenscale=tenscale,
                    meta=None if meta is None else meta.reshape(-1),
                    mask=None if mask is None else mask.reshape(-1),
                )
    return found, others


def quantized_weights(model: onnx.ModelProto | str | os.PathLike[str]) -> dict[str, QTensor]:
    """The weights a packed model stores quantized, as compress-mode QTensors.

    Every ``DequantizeMX`` node whose inputs are initializers (or Constants) gives one entry,
    named after the node's output (the float weight it replaces); ``onnxq.upcast`` of it is
    what the node computes.

    Args:
        model: a ModelProto (external data loaded) or the path of an .onnx file.

    Returns:
        Weight name -> QTensor (mode ``compress``, the node's dtype, axis and shape).
    """
    return _find(_as_model(model))[0]


def _as_model(model: onnx.ModelProto | str | os.PathLike[str]) -> onnx.ModelProto:
    # External data is read only from regular files inside the model's folder (for a
    # ModelProto: the working directory, where onnx would look), never from elsewhere.
    if isinstance(model, onnx.ModelProto):
        if any(t.data_location == onnx.TensorProto.EXTERNAL for t in all_tensors(model)):
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            load_external(copy, Path.cwd())
            return copy
        return model
    return load_model(model)


def _format_name(dt: DataType) -> str:
    names = sorted((len(n), n) for n, d in datatypes().items() if d.code == dt.code)
    return names[0][1] if names else dt.code


def layout_of(dt: DataType | str) -> str:
    """The hardware layout of a data type: ``bfp-int8``, ``mx-record`` or ``ocp-mx``.

    Args:
        dt: a DataType, preset name or data type code.

    Returns:
        The layout name.

    Raises:
        ExportError: the data type has no hardware layout (codebooks, NVFP4, float or
            channel scales, zero points, 2-D tiles, N:M sparsity), naming why.
    """
    dt = datatype(dt) if isinstance(dt, str) else dt
    n, s = dt.nspec, dt.sspec
    name = _format_name(dt)

    def refuse(why: str) -> ExportError:
        return ExportError(f"format {name} ({dt.code}) has no hardware layout: {why}")

    if n.is_codebook:
        raise refuse("codebook formats are not exported")
    if s is None or not s.scale.is_exponent or s.scale.bits != 8 or s.scale.bias != 127:
        raise refuse("only E8M0-scaled block formats (BFP, MX9/6/4, OCP MX) are exported")
    if s.zero is not None or s.tenscale is not None:
        raise refuse("zero points and tensor scales are not part of any layout")
    if len(s.tiles) != 1 or s.tiles[0].size <= 0 or s.tiles[0].sparse_m:
        raise refuse("only 1-D blocks of a fixed size without N:M sparsity are exported")
    tile = s.tiles[0]
    if tile.subtile:
        if n.is_int and n.signed and n.bits in _MX_BITS and tile.size == 16 and tile.subtile == 2:
            return "mx-record"
        raise refuse("subtiles exist only in MX9/MX6/MX4 (int8/5/3, block 16, pairs)")
    if n.is_int and n.signed and n.bits == 8 and tile.size == 32:
        return "ocp-mx"  # MXINT8
    if n.is_int and n.signed and 2 <= n.bits <= 8:
        return "bfp-int8"
    if str(n) in _OCP_FLOATS:
        return "ocp-mx"
    raise refuse("its elements are neither ints nor OCP MX floats")


# -- geometry --------------------------------------------------------------------------------
def _rows(a: np.ndarray, axis: int) -> np.ndarray:
    """``a`` with ``axis`` moved last, as a 2-D ``rows x length`` array."""
    moved = np.moveaxis(a, axis, -1)
    return moved.reshape(-1, moved.shape[-1])


def _unrows(rows: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    moved = [d for i, d in enumerate(shape) if i != axis] + [rows.shape[-1]]
    return np.moveaxis(rows.reshape(moved), -1, axis)


def _signed(codes: np.ndarray, bits: int) -> np.ndarray:
    c = codes.astype(np.int16)
    return np.where(c >= 1 << (bits - 1), c - (1 << bits), c).astype(np.int16)


def _codes_and_meta(q: QTensor) -> tuple[np.ndarray, np.ndarray | None]:
    """Unpacked element codes (input shape) and shift bits (subtile grid) of a 1-D tiling."""
    count = math.prod(q.shape)
    codes = unpack_bits(q.data, q.dtype.nspec.bits, count).reshape(q.shape)
    meta = None
    sub = q.dtype.sspec.tiles[0].subtile if q.dtype.sspec is not None else 0
    if q.meta is not None and sub:
        grid = list(q.shape)
        grid[q.axis] = -(-q.shape[q.axis] // sub)
        meta = unpack_bits(q.meta, 1, math.prod(grid)).reshape(grid)
    return codes, meta


def _bits_le(values: np.ndarray, width: int) -> np.ndarray:
    """Bits of non-negative ints, least significant first: shape ``values.shape + (width,)``."""
    v = values.astype(np.uint32)[..., None]
    return ((v >> np.arange(width, dtype=np.uint32)) & 1).astype(np.uint8)


def _from_bits_le(bits: np.ndarray) -> np.ndarray:
    weights = np.left_shift(np.uint32(1), np.arange(bits.shape[-1], dtype=np.uint32))
    return (bits.astype(np.uint32) * weights).sum(axis=-1).astype(np.uint32)


# -- encoders: (blobs, geometry extras) per layout -------------------------------------------
def _encode_bfp(
    codes: np.ndarray, scales: np.ndarray, bits: int, block: int, name: str
) -> dict[str, np.ndarray]:
    rows, blocks = scales.shape
    if (scales == 255).any():
        raise ExportError(f"weight {name!r} has a NaN block, which the BFP layout cannot hold")
    if (scales > 253).any():
        raise ExportError(
            f"weight {name!r} has a block of 2^127 or more, whose shared exponent does not "
            "fit the BFP layout's int8"
        )
    mant = np.zeros((rows, blocks * block), dtype=np.int8)
    mant[:, : codes.shape[1]] = _signed(codes, bits)
    exps = (scales.astype(np.int16) - 126).astype(np.int8)
    return {"packed": np.concatenate([exps.reshape(-1), mant.reshape(-1)])}


def _encode_mx(
    codes: np.ndarray, scales: np.ndarray, shifts: np.ndarray, bits: int, name: str
) -> dict[str, np.ndarray]:
    rows, blocks = scales.shape
    m = bits - 1
    s = np.zeros((rows, blocks * 16), dtype=np.int16)
    s[:, : codes.shape[1]] = _signed(codes, bits)
    if (np.abs(s) > (1 << m) - 1).any():
        raise ExportError(
            f"weight {name!r} holds the code -2^{m} (full int range), which {m + 1}-bit "
            "sign-magnitude cannot hold"
        )
    sh = np.zeros((rows, blocks * 8), dtype=np.uint8)
    sh[:, : shifts.shape[1]] = shifts
    sm = (np.abs(s) | ((s < 0).astype(np.int16) << m)).reshape(-1, 16)
    record = np.concatenate(
        [
            _bits_le(scales.reshape(-1), 8),
            sh.reshape(-1, 8),
            _bits_le(sm, bits).reshape(-1, 16 * bits),
        ],
        axis=1,
    )
    return {"records": np.packbits(record, axis=1, bitorder="little").reshape(-1)}


def _encode_ocp(
    codes: np.ndarray, scales: np.ndarray, dt: DataType, block: int, name: str
) -> dict[str, np.ndarray]:
    rows, blocks = scales.shape
    n = dt.nspec
    if str(n) in _OCP_FLOATS and n.bits < 8 and (codes == 1 << (n.bits - 1)).any():
        raise ExportError(f"weight {name!r} has a NaN element, which OCP FP{n.bits} cannot encode")
    padded = np.zeros((rows, blocks * block), dtype=code_dtype(n.bits))
    padded[:, : codes.shape[1]] = codes
    return {
        "elements": pack_bits(padded.reshape(-1), n.bits),
        "scales": scales.reshape(-1).astype(np.uint8),
    }


def _entry(name: str, q: QTensor) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    dt = q.dtype
    layout = layout_of(dt)
    assert dt.sspec is not None and q.scale is not None
    block = dt.sspec.tiles[0].size
    codes, meta = _codes_and_meta(q)
    code_rows = _rows(codes, q.axis)
    scale_rows = _rows(np.asarray(q.scale), q.axis).astype(np.uint8)
    rows, length = code_rows.shape
    blocks = scale_rows.shape[1]
    bits = dt.nspec.bits
    entry: dict[str, Any] = {
        "name": name,
        "shape": list(q.shape),
        "tile_axis": q.axis,
        "format": _format_name(dt),
        "dtype": dt.code,
        "layout": layout,
        "block_size": block,
        "rows": rows,
        "row_length": length,
        "row_shape": list(np.moveaxis(codes, q.axis, -1).shape),
        "blocks_per_row": blocks,
        "element_bits": bits,
        "padded": length % block != 0,
    }
    if entry["padded"]:
        entry["padding"] = (
            f"the last block of each row holds {length % block} values; its other "
            f"{block - length % block} are zero codes"
        )
    if layout == "bfp-int8":
        entry["mantissa_bits"] = bits
        entry["num_blocks"] = rows * blocks
        blobs = _encode_bfp(code_rows, scale_rows, bits, block, name)
    elif layout == "mx-record":
        assert meta is not None
        entry["record_bits"] = 16 + 16 * bits
        entry["record_bytes"] = (16 + 16 * bits) // 8
        entry["element_encoding"] = f"sign-magnitude, 1 sign + {bits - 1} magnitude bits"
        blobs = _encode_mx(code_rows, scale_rows, _rows(meta, q.axis), bits, name)
    else:
        n = dt.nspec
        entry["element_format"] = _OCP_FLOATS.get(str(n), "int8")
        entry["element_packing"] = {
            8: "one per byte",
            6: "four per 3 bytes, least significant bit first",
            4: "two per byte, low nibble first",
        }[bits]
        blobs = _encode_ocp(code_rows, scale_rows, dt, block, name)
    return entry, blobs


# -- export ----------------------------------------------------------------------------------
def _no_weights_message(model: onnx.ModelProto) -> str:
    """Why a model has no DequantizeMX weights to export, and how to make one that has."""
    meta = {p.key: p.value for p in model.metadata_props}
    again = "quantize the float model again with the defaults (--storage packed --target onnxq)"
    stored = stored_tensors(model)
    lowered = any(
        n.op_type in ("DequantizeLinear", "Gather") and n.domain in ("", "ai.onnx")
        and n.input and n.input[0] in stored
        and stored[n.input[0]].data_type != onnx.TensorProto.FLOAT
        for g in walk_graphs(model.graph) for n in g.node
    )  # fmt: skip
    if meta.get("onnxq_target") == "standard" or ("onnxq_version" in meta and lowered):
        return (
            "the model was quantized with --target standard: its weights are plain "
            "DequantizeLinear/Gather nodes, which export does not read; " + again + " and "
            "export that"
        )
    if meta.get("onnxq_weight_storage") == "fake":
        return (
            "the model was quantized with --storage fake: its weights are stored as floats, "
            "with no codes to export; " + again + " and export that"
        )
    if "onnxq_version" in meta:
        return (
            "the model has no quantized weights (no DequantizeMX node reading stored codes: "
            "only activations were quantized?); quantize the float model with --weights FMT "
            "(packed storage, onnxq target) and export that"
        )
    return (
        "the model has no quantized weights (it was not quantized by onnxq); quantize it "
        "first, e.g. `onnxq quantize MODEL -o Q.onnx --weights mxfp8e4`, and export Q.onnx"
    )


def export(
    model: onnx.ModelProto | str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write every quantized weight of a packed model in its hardware layout.

    Args:
        model: a quantized ModelProto (external data loaded) or the path of its .onnx file.
        out_dir: the folder to write ``weights.bin`` and ``manifest.json`` into (created if
            missing).
        overwrite: write into a non-empty folder (replaces those two files; other files stay).

    Returns:
        The manifest that was written.

    Raises:
        ExportError: no quantized weights, a weight whose format has no hardware layout (or
            whose values the layout cannot hold), or a non-empty ``out_dir`` without
            ``overwrite``.
    """
    import onnxq

    weights, others = _find(_as_model(model))
    if others:
        tensor, code = others[0]
        raise ExportError(
            f"weight {tensor!r} is a codebook format ({code}), which has no hardware layout"
        )
    if not weights:
        raise ExportError(_no_weights_message(_as_model(model)))
    parts = []
    for name, q in weights.items():
        try:
            parts.append(_entry(name, q))
        except ExportError as err:
            if str(err).startswith("weight "):
                raise
            raise ExportError(f"weight {name!r}: {err}") from None
    out = Path(out_dir)
    if out.is_dir():
        _output.sweep(out)  # hidden temporaries of a killed export do not make it "not empty"
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ExportError(
            f"the output folder {str(out)!r} is not empty; pass --overwrite "
            "(overwrite=True) or choose an empty folder"
        )
    created = not out.is_dir()
    out.mkdir(parents=False, exist_ok=True)
    tensors = []
    offset = 0
    try:
        # Locked temporaries renamed into place (onnxq._output). The data file is renamed
        # first; a kill before the manifest follows pairs an old manifest with new data,
        # which `load` detects (each blob's sha256 is in the manifest).
        with _output.new_file(out / DATA_FILE) as (f, data_tmp), \
                _output.new_file(out / MANIFEST) as (mf, manifest_tmp):  # fmt: skip
            for entry, blobs in parts:
                entry["blobs"] = {}
                for key, blob in blobs.items():
                    raw = np.ascontiguousarray(blob).tobytes()
                    pad = -offset % _ALIGN
                    f.write(b"\0" * pad)
                    offset += pad
                    f.write(raw)
                    entry["blobs"][key] = {
                        "offset": offset,
                        "length": len(raw),
                        "dtype": "int8" if blob.dtype == np.int8 else "uint8",
                        "sha256": hashlib.sha256(raw).hexdigest(),
                    }
                    offset += len(raw)
                tensors.append(entry)
            manifest = {
                "onnxq_version": onnxq.__version__,
                "manifest_version": MANIFEST_VERSION,
                "data_file": DATA_FILE,
                "alignment": _ALIGN,
                "byte_order": "bits least significant first; multi-byte fields none (all bytes)",
                "tensors": tensors,
            }
            mf.write((json.dumps(manifest, indent=1) + "\n").encode("utf-8"))
            f.flush()
            mf.flush()
            _output.replace(data_tmp, out / DATA_FILE)
            _output.replace(manifest_tmp, out / MANIFEST)
    except BaseException:
        if created:  # leave no empty folder behind
            with contextlib.suppress(OSError):
                out.rmdir()
        raise
    return manifest


# -- decoders: from the layout alone ---------------------------------------------------------
def _pow2(e: np.ndarray) -> np.ndarray:
    return np.ldexp(1.0, e.astype(np.int64))


def _decode_bfp(entry: dict[str, Any], packed: np.ndarray) -> dict[str, np.ndarray]:
    rows, blocks, block = entry["rows"], entry["blocks_per_row"], entry["block_size"]
    bits = entry["mantissa_bits"]
    exps = packed[: rows * blocks].reshape(rows, blocks)
    mant = packed[rows * blocks :].reshape(rows, blocks * block)
    step = np.repeat(exps.astype(np.int64), block, axis=1) - (bits - 1)
    values = (mant.astype(np.float64) * _pow2(step)).astype(np.float32)
    return {
        "exponents": exps,
        "mantissas": mant,
        "values": values,
        "codes": (mant.astype(np.int16) & ((1 << bits) - 1)).astype(code_dtype(bits)),
        "scales": (exps.astype(np.int16) + 126).astype(np.uint8),
    }


def decode_mx_records(records: np.ndarray, bits: int) -> dict[str, np.ndarray]:
    """Split MX9/MX6/MX4 records (``mx-record`` layout) into their fields and values.

    Args:
        records: uint8, ``N x record_bytes`` (or flat), records of 16 values.
        bits: element width m + 1: 8 (MX9), 5 (MX6) or 3 (MX4).

    Returns:
        ``exponents`` (N, E8M0 codes), ``shifts`` (N x 8), ``signs`` and ``magnitudes``
        (N x 16) and ``values`` (N x 16 float32: ``(-1)^sign * magnitude *
        2^(exponent - 127 - (m - 1) - shift)``; NaN where the exponent is 255).
    """
    nbytes = (16 + 16 * bits) // 8
    r = np.asarray(records, dtype=np.uint8).reshape(-1, nbytes)
    b = np.unpackbits(r, axis=1, bitorder="little")
    exps = _from_bits_le(b[:, :8])
    shifts = b[:, 8:16]
    elems = _from_bits_le(b[:, 16:].reshape(-1, 16, bits))
    m = bits - 1
    signs = (elems >> m) & 1
    mags = elems & ((1 << m) - 1)
    step = exps.astype(np.int64)[:, None] - 127 - (m - 1) - np.repeat(shifts, 2, axis=1)
    values = np.where(signs == 1, -1.0, 1.0) * mags * _pow2(step)
    values = np.where((exps == 255)[:, None], np.nan, values).astype(np.float32)
    return {
        "exponents": exps.astype(np.uint8),
        "shifts": shifts,
        "signs": signs.astype(np.uint8),
        "magnitudes": mags.astype(np.uint8),
        "values": values,
    }


def _decode_mx(entry: dict[str, Any], records: np.ndarray) -> dict[str, np.ndarray]:
    rows, blocks, bits = entry["rows"], entry["blocks_per_row"], entry["element_bits"]
    f = decode_mx_records(records, bits)
    signed = np.where(f["signs"] == 1, -f["magnitudes"].astype(np.int16), f["magnitudes"])
    return {
        "records": records.reshape(rows * blocks, -1),
        "exponents": f["exponents"].reshape(rows, blocks),
        "shifts": f["shifts"].reshape(rows, blocks * 8),
        "values": f["values"].reshape(rows, blocks * 16),
        "codes": (signed.astype(np.int16) & ((1 << bits) - 1))
        .astype(np.uint8)
        .reshape(rows, blocks * 16),
        "scales": f["exponents"].reshape(rows, blocks),
    }


def _ocp_float(codes: np.ndarray, fmt: str) -> np.ndarray:
    ebits, mbits = {"fp8_e4m3": (4, 3), "fp8_e5m2": (5, 2), "fp6_e2m3": (2, 3),
                    "fp6_e3m2": (3, 2), "fp4_e2m1": (2, 1)}[fmt]  # fmt: skip
    bias = (1 << (ebits - 1)) - 1
    c = codes.astype(np.int64)
    sign = np.where((c >> (ebits + mbits)) & 1, -1.0, 1.0)
    e = (c >> mbits) & ((1 << ebits) - 1)
    man = c & ((1 << mbits) - 1)
    mag = np.where(
        e == 0,
        man * _pow2(np.full_like(e, 1 - bias - mbits)),
        (man + (1 << mbits)) * _pow2(e - bias - mbits),
    )
    out = sign * mag
    if fmt == "fp8_e4m3":
        out = np.where((c & 0x7F) == 0x7F, np.nan, out)
    elif fmt == "fp8_e5m2":
        out = np.where(e == 31, np.where(man == 0, sign * np.inf, np.nan), out)
    return out


def _decode_ocp(entry: dict[str, Any], elements: np.ndarray, scales: np.ndarray) -> dict:
    rows, blocks, block = entry["rows"], entry["blocks_per_row"], entry["block_size"]
    bits = entry["element_bits"]
    codes = unpack_bits(elements, bits, rows * blocks * block).reshape(rows, blocks * block)
    sc = scales.reshape(rows, blocks)
    if entry["element_format"] == "int8":
        elem = _signed(codes, 8).astype(np.float64) * 2.0**-6
    else:
        elem = _ocp_float(codes, entry["element_format"])
    scale = np.repeat(sc.astype(np.int64), block, axis=1)
    values = np.where(scale == 255, np.nan, elem * _pow2(scale - 127)).astype(np.float32)
    return {"codes": codes, "scales": sc, "values": values}


# -- load ------------------------------------------------------------------------------------
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
        ``values`` (float32 of the weight's shape, decoded from the layout alone) and
        ``qtensor`` (an ``actual``-mode `QTensor`; ``onnxq.upcast`` of it equals the model's
        dequantized weight bit for bit).

    Raises:
        LoadError: a missing or unreadable manifest or data file, a manifest from a newer
            onnxq, a malformed manifest (missing or mistyped field, a ``data_file`` outside
            the folder or not a regular file, sizes that do not match the format and shape),
            a blob outside the data file or whose sha256 does not match.
    """
    import onnxq

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
    if _version_tuple(written) > _version_tuple(onnxq.__version__) or version > MANIFEST_VERSION:
        raise LoadError(
            f"{str(path)!r} was written by onnxq {written} (manifest version "
            f"{version}), newer than this onnxq "
            f"{onnxq.__version__}; upgrade onnxq to read it"
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
    expected = {"rows": rows, "row_length": length, "block_size": block,
                "blocks_per_row": -(-length // block), "element_bits": bits}  # fmt: skip
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
            sizes = {"elements": ("uint8", (rows * blocks * block * bits + 7) // 8),
                     "scales": ("uint8", rows * blocks)}  # fmt: skip
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
