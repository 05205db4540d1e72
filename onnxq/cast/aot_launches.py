"""Recording the host's kernel launches (`onnxq.cast.aot_record`'s input).

The host functions (`triton.quantize`, `triton.dequantize`, `triton_fast.quantize`) run on
small CPU tensors with their kernels replaced by recorders, so a recorded launch gives every
argument the host computes: constexprs, scalars, pointer types.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

from onnxq.cast.aot_spec import _ROLES, MODE_PARAMS, MODES, GenerationError


@dataclasses.dataclass
class Launch:
    """One recorded launch: the JIT function and the arguments the host passed."""

    kernel: Any
    args: tuple
    kwargs: dict


@contextlib.contextmanager
def recording(tm: Any) -> Iterator[list[Launch]]:
    """Replace the kernels of module ``tm`` by recorders for the duration of the block."""
    kinds = ("JITFunction", "InterpretedFunction")  # (TRITON_INTERPRET=1: the tests)
    names = [n for n, v in vars(tm).items() if type(v).__name__ in kinds]
    names = [n for n in names if n in _ROLES]
    saved = {n: getattr(tm, n) for n in names}
    launches: list[Launch] = []

    class Recorder:
        def __init__(self, fn: Any) -> None:
            self.fn = fn

        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> None:
                launches.append(Launch(self.fn, args, kwargs))

            return launch

    try:
        for n in names:
            setattr(tm, n, Recorder(saved[n]))
        yield launches
    finally:
        for n, fn in saved.items():
            setattr(tm, n, fn)


def record_quant(
    tm: Any,
    dt: Any,
    shape: tuple[int, ...],
    in_type: str,
    want: str,
    axis: int,
    **modes: int,
):
    """The launches of one quantization; ``modes`` by C ABI number (aot_spec.MODES), else 0."""
    import torch

    from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode

    x = torch.zeros(shape, dtype=getattr(torch, in_type))
    chosen = {m: names[modes.get(m, 0)] for m, names in MODES.items()}
    with recording(tm) as launches:
        tm.quantize(
            x,
            dt,
            axis=axis,
            round_mode=RoundMode(chosen["round_mode"]),
            scale_mode=ScaleMode(chosen["scale_mode"]),
            nan_policy=NanPolicy(chosen["nan_policy"]),
            seed=0,
            full_int_range=chosen["full_int_range"],
            want_values=want in ("values", "both"),
            want_codes=want in ("codes", "both"),
        )
    return launches


# Experiments' switches of the engines, which a build must not pick up
_KNOBS = ("ONNXQ_TRITON_PACK_GROUP", "ONNXQ_TRITON_CB_CONFIG")


@contextlib.contextmanager
def default_packing() -> Iterator[None]:
    """The default packing layout and codebook program, whatever the build's environment says."""
    saved = {k: os.environ.pop(k) for k in _KNOBS if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def record_fast(tf: Any, dt: Any, shape: tuple[int, ...], in_type: str, want: str, axis: int = -1):
    """The fast path's launches for one cast (the tuned program size, not the environment's)."""
    import torch

    from onnxq.formats.modes import NanPolicy, RoundMode, ScaleMode

    fp = tf._fast_plan(shape, dt, axis, RoundMode.EVEN, tf._BLOCK, tf._WARPS)
    if fp is None:
        why = tf.why_not_fast(shape, dt, axis, RoundMode.EVEN)
        raise GenerationError(f"{dt.code}: the fast path refuses {shape} ({why})")
    x = torch.zeros(shape, dtype=getattr(torch, in_type))
    with recording(tf) as launches, default_packing():
        tf.quantize(
            x,
            dt,
            fp,
            scale_mode=ScaleMode.FLOOR,
            nan_policy=NanPolicy.ELEMENT,
            full_int_range=False,
            want_values=want == "values",
            want_codes=want != "values",
            packed=want == "packed",
        )
    return launches


def record_dequant(tm: Any, dt: Any, shape: tuple[int, ...], out_type: str, axis: int):
    """The launches of one dequantization of zero codes (tiles along ``axis``)."""
    import torch

    p = tm.plan(shape, dt, axis)
    code_t = torch.uint8 if dt.nspec.bits <= 8 else torch.uint16
    codes = torch.zeros(shape, dtype=code_t)
    s = dt.sspec
    scale = tenscale = meta = None
    if s is not None:
        scale = torch.zeros(p.grid_shape, dtype=tm._code_torch_dtype(s.scale.bits))
        if s.tenscale is not None:
            tenscale = torch.tensor([1.0], dtype=torch.float32).view(torch.uint32)
        if p.sub:
            meta = torch.zeros(p.meta_shape, dtype=torch.uint8)
    with recording(tm) as launches:
        tm.dequantize(
            dt,
            shape,
            axis,
            codes,
            scale=scale,
            tenscale=tenscale,
            meta=meta,
            out_dtype=getattr(torch, out_type),
        )
    return launches


def mode_table(tm: Any, dt: Any, preset: str, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """`FormatInfo.modes`: the general quantize kernel's mode parameters, by mode number.

    Recorded from the host code one mode at a time. Raises GenerationError unless each mode
    changes its parameter (`MODE_PARAMS`) alone, constexprs included (one image serves them
    all), and the modes combine (all at their last value: each parameter's own).
    """

    def launch(**modes: int) -> dict[str, Any]:
        rec = named(record_quant(tm, dt, shape, "float32", "both", -1, **modes), "_quant_kernel")
        if len(rec) != 1:
            raise GenerationError(f"{preset}: expected one _quant_kernel launch")
        bound = dict(zip(rec[0].kernel.arg_names, rec[0].args, strict=False))
        return {k: v for k, v in {**bound, **rec[0].kwargs}.items() if not hasattr(v, "data_ptr")}

    base = launch()
    table: dict[str, tuple[int, ...]] = {}
    for mode, param in MODE_PARAMS.items():
        values = []
        for number in range(len(MODES[mode])):
            got = launch(**{mode: number})
            changed = sorted(k for k in base if got[k] != base[k])
            if changed not in ([], [param]):
                raise GenerationError(f"{preset}: {mode} {number} changes {changed}, not {param}")
            values.append(int(got[param]))
        table[param] = tuple(values)
    last = launch(**{m: len(v) - 1 for m, v in MODES.items()})
    if any(last[p] != table[p][-1] for p in MODE_PARAMS.values()):
        raise GenerationError(f"{preset}: the modes' parameters do not combine")
    return table


def named(launches: list[Launch], kernel: str) -> list[Launch]:
    """The launches of the kernel called ``kernel``."""
    return [la for la in launches if la.kernel.fn.__name__ == kernel]
