"""The hardware layouts of `onnxq.deploy.export`: which one a format has, its blobs' bytes.

``bfp-int8`` (through `onnxq.deploy.bfp_codec`), ``mx-record`` and ``ocp-mx`` (docs/layouts.md):
the encoders turn a weight's rows of element codes and E8M0 scales into blobs, the decoders
turn blobs back into codes, scales and float32 values from the layout alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxq.cast.packing import code_dtype, pack_bits, unpack_bits
from onnxq.deploy import bfp_codec
from onnxq.formats.datatype import DataType, datatype, datatypes

__all__ = [
    "DATA_FILE",
    "MANIFEST",
    "MANIFEST_VERSION",
    "ExportError",
    "decode_mx_records",
    "layout_of",
]

MANIFEST = "manifest.json"
DATA_FILE = "weights.bin"
MANIFEST_VERSION = 1
_OCP_FLOATS = {  # onnxq code -> OCP element name
    "e4m3fn": "fp8_e4m3",
    "e5m2": "fp8_e5m2",
    "e2m3fnuz": "fp6_e2m3",
    "e3m2fnuz": "fp6_e3m2",
    "e2m1fnuz": "fp4_e2m1",
}
_MX_BITS = (8, 5, 3)  # MX9, MX6, MX4 element widths (m + 1)


# -- which layout a format has ---------------------------------------------------------------
class ExportError(ValueError):
    """The model cannot be exported (no quantized weights, no hardware layout, folder in use)."""


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
    if (scales > bfp_codec.MAX_SCALE_CODE).any():
        raise ExportError(
            f"weight {name!r} has a block of 2^127 or more, whose shared exponent does not "
            "fit the BFP layout's int8"
        )
    mant = np.zeros((rows, blocks * block), dtype=np.int8)
    mant[:, : codes.shape[1]] = bfp_codec.mantissas(codes, bits)
    return {"packed": bfp_codec.pack(bfp_codec.shared_exponents(scales), mant)}


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


# -- decoders: from the layout alone ---------------------------------------------------------
def _pow2(e: np.ndarray) -> np.ndarray:
    return np.ldexp(1.0, e.astype(np.int64))


def _decode_bfp(entry: dict[str, Any], packed: np.ndarray) -> dict[str, np.ndarray]:
    rows, blocks, block = entry["rows"], entry["blocks_per_row"], entry["block_size"]
    bits = entry["mantissa_bits"]
    exps, mant = bfp_codec.unpack(packed, rows * blocks)
    exps, mant = exps.reshape(rows, blocks), mant.reshape(rows, blocks * block)
    return {
        "exponents": exps,
        "mantissas": mant,
        "values": bfp_codec.values(mant, np.repeat(exps, block, axis=1), bits),
        "codes": bfp_codec.element_codes(mant, bits),
        "scales": bfp_codec.scale_codes(exps),
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
    ebits, mbits = {
        "fp8_e4m3": (4, 3),
        "fp8_e5m2": (5, 2),
        "fp6_e2m3": (2, 3),
        "fp6_e3m2": (3, 2),
        "fp4_e2m1": (2, 1),
    }[fmt]
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
