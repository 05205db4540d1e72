"""Code tensors on the device: signed views and packing.py's bit stream with torch ops."""

from __future__ import annotations

import math

import torch

from onnxq.cast.triton_plan import _code_torch_dtype, _store_dtype
from onnxq.formats.number import InfNaN, NumberSpec


# -- host side ---------------------------------------------------------------------------------
def _int_view(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


def _to_code(t: torch.Tensor, bits: int) -> torch.Tensor:
    if bits <= 16:
        return t.to(_store_dtype(bits)).view(_code_torch_dtype(bits))
    return t.to(torch.int32).view(torch.uint32)


def _signed(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.uint16:
        return t.view(torch.int16)
    if t.dtype == torch.uint32:
        return t.view(torch.int32)
    return t


def _flat_codes(t: torch.Tensor) -> torch.Tensor:
    return _signed(t.contiguous().reshape(-1))


def float32_bits(codes: torch.Tensor, n: NumberSpec) -> torch.Tensor:
    """Float32 bits (int32) of the values of float codes, rounded once to float32.

    `NumberSpec.decode` then a float32 conversion (numpy's decode then astype), with torch ops,
    for the scale and zero-point codes over 16 bits that the kernels' decode tables cannot
    hold: the magnitude ``sig * 2^exp`` is exact in float64 (the format limits); exponents
    below -182 are raised to it, as ``sig * 2^-182`` (``sig < 2^31``) is under 2^-151 and
    rounds to float32's 0 like the exact value; the convention's NaN and Inf codes.
    """
    c = codes.to(torch.int64) & ((1 << n.bits) - 1)
    sign_bit = 1 << (n.bits - 1)
    negative = (c & sign_bit) != 0
    magnitude = c & (sign_bit - 1)
    field = magnitude >> n.mbits
    mant = magnitude & ((1 << n.mbits) - 1)
    sig = torch.where(field == 0, mant, mant | (1 << n.mbits)).to(torch.float64)
    exp = field.clamp(min=1) - n.bias - n.mbits
    pow2 = ((exp.clamp(min=-182) + 1023) << 52).view(torch.float64)  # a normal float64
    bits = (sig * pow2).to(torch.float32).view(torch.int32).to(torch.int64)
    bits = bits | (negative.to(torch.int64) << 31)
    inf = 0x7F800000 | (negative.to(torch.int64) << 31)
    top_field, top_mant = (1 << n.ebits) - 1, (1 << n.mbits) - 1
    if n.infnan is InfNaN.IEEE:
        bits = torch.where(field == top_field, torch.where(mant != 0, 0x7FC00000, inf), bits)
    elif n.infnan is InfNaN.FN:
        bits = torch.where((field == top_field) & (mant == top_mant), 0x7FC00000, bits)
    else:  # fnuz, inuz: NaN is the negative-zero code; inuz's Inf the largest magnitudes
        if n.infnan is InfNaN.INUZ:
            bits = torch.where(magnitude == sign_bit - 1, inf, bits)
        bits = torch.where(c == sign_bit, 0x7FC00000, bits)
    return (bits & 0xFFFFFFFF).to(torch.int32)  # two's complement wrap of the top bit


# -- packing on the device (packing.py's stream, with torch ops) -------------------------------
def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned codes (C order) into packing.py's little-endian uint8 stream.

    Raises:
        NotImplementedError: widths over 32 bits.
    """
    flat = _flat_codes(codes)
    count = flat.numel()
    nbytes = (count * bits + 7) // 8
    if bits in (8, 16, 32):
        return flat.view(torch.uint8)  # the kernels' code tensor is fresh: no copy needed
    if bits > 32:
        raise NotImplementedError(f"packing {bits}-bit codes on the device")
    if bits > 8:  # rare widths: one byte per bit, then eight bits per byte
        lane = torch.arange(bits, device=flat.device, dtype=torch.int64)
        bit = ((flat.to(torch.int64)[:, None] >> lane) & 1).reshape(-1)
        bit = torch.nn.functional.pad(bit, (0, nbytes * 8 - bit.numel()))
        weight = 1 << torch.arange(8, device=flat.device, dtype=torch.int64)
        return (bit.view(nbytes, 8) * weight).sum(dim=1).to(torch.uint8)
    # `per` codes fill `bits * per / 8` whole bytes; gather them into one word, then split it
    per = 8 // math.gcd(8, bits)
    wide = torch.int32 if per * bits <= 31 else torch.int64
    groups = -(-count // per)
    if groups * per != count:
        padded = torch.zeros(groups * per, dtype=torch.uint8, device=flat.device)
        padded[:count] = flat
        flat = padded
    lanes = flat.view(groups, per)
    if per * bits == 8:  # 1, 2, 4 bits: the word is the byte
        word = lanes[:, 0].clone()
        for k in range(1, per):
            word |= lanes[:, k] << (k * bits)
        return word[:nbytes]
    word = lanes[:, 0].to(wide)
    for k in range(1, per):
        word |= lanes[:, k].to(wide) << (k * bits)
    out = torch.empty(groups, per * bits // 8, dtype=torch.uint8, device=flat.device)
    for b in range(per * bits // 8):
        out[:, b] = (word >> (8 * b)) & 0xFF
    return out.view(-1)[:nbytes]


def unpack_bits(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Inverse of `pack_bits`: the first ``count`` codes.

    Raises:
        NotImplementedError: widths over 32 bits.
        ValueError: the stream is too short.
    """
    need = (count * bits + 7) // 8
    stream = packed.contiguous().reshape(-1)
    if stream.numel() < need:
        raise ValueError(
            f"packed stream has {stream.numel()} bytes; {count} codes of {bits} bits need {need}"
        )
    if bits == 8:
        return stream[:count].clone()
    if bits == 16:
        return stream[: 2 * count].clone().view(torch.int16).view(torch.uint16)
    if bits == 32:
        return stream[: 4 * count].clone().view(torch.int32).view(torch.uint32)
    if bits > 32:
        raise NotImplementedError(f"unpacking {bits}-bit codes on the device")
    if bits > 8:  # rare widths: the bits of each code from its bytes, as int32
        lane = torch.arange(8, device=stream.device, dtype=torch.int64)
        bit = ((stream[:need].to(torch.int64)[:, None] >> lane) & 1).reshape(-1)
        bit = bit[: count * bits].view(count, bits)
        weight = 1 << torch.arange(bits, device=stream.device, dtype=torch.int64)
        return (bit * weight).sum(dim=1).to(torch.int32).view(torch.uint32)
    groups = -(-count // 8)
    padded = torch.zeros(groups * bits, dtype=torch.int64, device=stream.device)
    padded[:need] = stream[:need].to(torch.int64)
    byte_shifts = torch.arange(bits, device=stream.device, dtype=torch.int64) * 8
    word = (padded.view(groups, bits) << byte_shifts).sum(dim=1)
    shifts = torch.arange(8, device=stream.device, dtype=torch.int64) * bits
    codes = (word[:, None] >> shifts) & ((1 << bits) - 1)
    return codes.reshape(-1)[:count].to(torch.uint8)
