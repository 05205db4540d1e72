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
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from onnxq import _output
from onnxq._files import all_tensors, load_external, load_model
from onnxq.cast.api import QTensor
from onnxq.cast.packing import unpack_bits
from onnxq.deploy.layouts import (
    _OCP_FLOATS,
    DATA_FILE,
    MANIFEST,
    MANIFEST_VERSION,
    ExportError,
    _encode_bfp,
    _encode_mx,
    _encode_ocp,
    _format_name,
    _rows,
    decode_mx_records,
    layout_of,
)
from onnxq.deploy.load import LoadError, load
from onnxq.formats.datatype import datatype
from onnxq.formats.modes import CastMode
from onnxq.graph.schemas import DOMAIN, input_index, input_names
from onnxq.graph.tiling import reshaped_outputs
from onnxq.graph.walk import node_attrs, stored_tensors, walk_graphs

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

_ALIGN = 64


# -- finding the quantized weights -----------------------------------------------------------
# The onnxq ops that read a packed weight (fused ones hold it as DequantizeMX's inputs, from Q).
_PACKED_READERS = ("DequantizeMX", "CodebookLookup", "MatMulMX", "GatherMX")


def _find(
    model: onnx.ModelProto,
) -> tuple[dict[str, QTensor], list[tuple[str, str]], dict[str, tuple[int, ...]]]:
    """DequantizeMX weights as QTensors, other stored quantized tensors, restored shapes.

    The last maps each weight tiled in another shape (a Reshape restores it) to its shape.
    """
    stored = stored_tensors(model)
    found: dict[str, QTensor] = {}
    others: list[tuple[str, str]] = []
    restored: dict[str, tuple[int, ...]] = {}
    for graph in walk_graphs(model.graph):
        reshaped = reshaped_outputs(graph, stored)
        for node in graph.node:
            if node.domain != DOMAIN or node.op_type not in _PACKED_READERS:
                continue
            first = input_index(node.op_type, "Q")  # after A (MatMulMX) or Indices (GatherMX)
            if len(node.input) <= first or node.input[first] not in stored:
                continue
            attrs = node_attrs(node)
            if node.op_type == "CodebookLookup" or (
                node.op_type == "GatherMX" and datatype(str(attrs.get("dtype"))).nspec.is_codebook
            ):
                others.append((node.output[0], str(attrs.get("dtype", "?"))))
                continue
            arrays: dict[str, np.ndarray | None] = {}
            for i, key in enumerate(input_names("DequantizeMX")):
                if key == "Shape" and node.op_type != "DequantizeMX":
                    arrays[key] = None  # the fused ops take the table's / B's shape attribute
                    continue
                slot = first + i
                name = node.input[slot] if slot < len(node.input) else ""
                if name and name not in stored:  # computed, not stored: not a weight
                    break
                arrays[key] = numpy_helper.to_array(stored[name]) if name else None
            else:
                dt = datatype(str(attrs["dtype"]))
                # The attribute, else a stored Shape input (the run-time form of X's shape).
                given = attrs.get("shape", arrays.get("Shape"))
                if given is None or len(given) == 0:
                    continue  # no shape: DequantizeMX refuses the node, nothing to export
                shape = tuple(int(d) for d in given)
                q_arr, meta, mask = arrays["Q"], arrays["Meta"], arrays["Mask"]
                assert q_arr is not None
                name = node.output[0]
                if node.op_type != "DequantizeMX":  # fused: the weight's name, from its codes'
                    q_name = node.input[first]
                    name = q_name[: -len("__q")] if q_name.endswith("__q") else q_name
                after = reshaped.get(name)
                if after is not None and math.prod(after[1]) == math.prod(shape):
                    name = after[0]  # a conv weight with a short reduction axis
                    restored[name] = after[1]
                found[name] = QTensor(
                    data=q_arr.reshape(-1),
                    dtype=dt,
                    shape=shape,
                    axis=int(attrs.get("axis", -1)) % len(shape),
                    mode=CastMode.COMPRESS,
                    scale=arrays["Scale"],
                    zero=arrays["Zero"],
                    tenscale=arrays["TenScale"],
                    meta=None if meta is None else meta.reshape(-1),
                    mask=None if mask is None else mask.reshape(-1),
                )
    return found, others, restored


def quantized_weights(model: onnx.ModelProto | str | os.PathLike[str]) -> dict[str, QTensor]:
    """The weights a packed model stores quantized, as compress-mode QTensors.

    Every ``DequantizeMX`` node whose inputs are initializers (or Constants) gives one entry,
    named after the node's output (the float weight it replaces); ``onnxq.upcast`` of it is
    what the node computes. A conv weight tiled as a matrix (a short reduction axis,
    ``docs/layouts.md``) is named after the ``Reshape`` that restores its shape, and its
    QTensor has the tiled shape: reshape the upcast to the weight's shape.

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
        n.op_type in ("DequantizeLinear", "Gather")
        and n.domain in ("", "ai.onnx")
        and n.input
        and n.input[0] in stored
        and stored[n.input[0]].data_type != onnx.TensorProto.FLOAT
        for g in walk_graphs(model.graph)
        for n in g.node
    )
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
    from onnxq._version import __version__

    weights, others, restored = _find(_as_model(model))
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
            entry, blobs = _entry(name, q)
            if name in restored:  # tiled as [rows, reduction]; the consumer reshapes it
                entry["weight_shape"] = list(restored[name])
            parts.append((entry, blobs))
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
        with (
            _output.new_file(out / DATA_FILE) as (f, data_tmp),
            _output.new_file(out / MANIFEST) as (mf, manifest_tmp),
        ):
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
                "onnxq_version": __version__,
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
