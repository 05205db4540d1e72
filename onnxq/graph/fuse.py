"""Fusions: an onnxq node merged with the standard op that reads its output.

A packed weight decoded by DequantizeMX and read by one Gather or MatMul can be served by one
fused onnxq op that reads the packed codes directly (only the gathered rows, or tiles of B
inside the GEMM). Each fusion rewrites its pattern in a quantized model in place, gives the
fused node a function fallback with the same bits, and returns how many nodes it fused.
`apply_fusions` runs the named ones in table order, and again until a round fuses nothing (the
outcome does not hang on the order: a tied table's Gathers fuse once its MatMul has);
`quantize_model` calls it after the rewrite, before the fallbacks are embedded.

Which run by default: `DEFAULT_FUSIONS`, the ones that never cost speed. ``gather`` (GatherMX
reads only the gathered rows) is one; ``matmul_mx`` is opt-in (``fuse="all"``, a list of names,
CLI ``--fuse matmul_mx,gather``, recipe ``fuse: all``): MatMulMX wins where decoding is
memory-bound (an LM decode step at batch 1: 0.40x float) but costs about 1.2x float from 64 rows
of A on, and the row count is rarely known at quantize time; an unfused packed weight is decoded
once at session creation and runs at float speed. With ``gather`` only, a tied table (Gather
and a MatMul by its transpose) stays as it is: the MatMul keeps the DequantizeMX, so the Gather
keeps reading its output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import onnx

from onnxq.graph.fuse_gather import fuse_gather
from onnxq.graph.fuse_matmul import fuse_matmul

__all__ = ["DEFAULT_FUSIONS", "FUSIONS", "apply_fusions", "chosen_fusions", "fusion_names"]

Fusion = Callable[[onnx.ModelProto], int]

# name -> fusion, in the order they run (one line per fusion module).
FUSIONS: dict[str, Fusion] = {
    "matmul_mx": fuse_matmul,  # DequantizeMX -> MatMul/Gemm B: MatMulMX
    "gather": fuse_gather,  # Gather of a packed table -> GatherMX (after any MatMul fusion)
}


# Rounds of the table at most: a fusion can open a pattern for one that ran before it (a tied
# table's Gathers become fusable once its MatMul is fused), so the table runs again until
# nothing changes; each fusion removes the nodes it matched, so a round that fuses none ends it.
_MAX_ROUNDS = 4

# The fusions `quantize_model` runs unless told otherwise: those that never cost speed.
DEFAULT_FUSIONS: tuple[str, ...] = ("gather",)


def fusion_names(fuse: bool | str | Sequence[str], where: str = "fuse") -> tuple[str, ...]:
    """The fusions a ``fuse`` value names, in table order.

    True: `DEFAULT_FUSIONS`; False: none; ``"all"``: every one in `FUSIONS`; a sequence of
    names, or one comma-separated string of them: those.

    Raises:
        ValueError: an unknown fusion name or a value of another type, in one line.
    """
    if isinstance(fuse, bool):
        return DEFAULT_FUSIONS if fuse else ()
    if isinstance(fuse, str):
        if fuse.strip() == "all":
            return tuple(FUSIONS)
        fuse = [n for n in fuse.split(",") if n.strip()]
    known = ", ".join(FUSIONS)
    if not isinstance(fuse, Sequence) or not all(isinstance(n, str) for n in fuse):
        raise ValueError(
            f"{where}: expected true, false, 'all' or a list of fusion names ({known}), "
            f"got {fuse!r}"
        )
    names = {n.strip() for n in fuse}
    unknown = sorted(names - set(FUSIONS))
    if unknown:
        raise ValueError(
            f"{where}: unknown fusion {', '.join(map(repr, unknown))}; known: {known} (or 'all')"
        )
    return tuple(n for n in FUSIONS if n in names)


def chosen_fusions(
    fuse: bool | str | Sequence[str], recipe_fuse: bool | str | Sequence[str]
) -> tuple[bool, tuple[str, ...]]:
    """Whether activations get one fused node, and the fusions to run, from both choices.

    False from either turns everything off; otherwise an argument other than True wins over
    the recipe's value.
    """
    if fuse is False or recipe_fuse is False:
        return False, ()
    return True, fusion_names(recipe_fuse if fuse is True else fuse)


def apply_fusions(model: onnx.ModelProto, names: Sequence[str] = DEFAULT_FUSIONS) -> dict[str, int]:
    """Run the named fusions on ``model`` (in place), until none fuses more; how many each fused."""
    chosen = {name: FUSIONS[name] for name in fusion_names(list(names), "apply_fusions")}
    counts = dict.fromkeys(chosen, 0)
    for _ in range(_MAX_ROUNDS):
        done = {name: fusion(model) for name, fusion in chosen.items()}
        for name, n in done.items():
            counts[name] += n
        if not any(done.values()):
            break
    return counts
