"""Fusions: an onnxq node merged with the standard op that reads its output.

A packed weight decoded by DequantizeMX and read by one Gather or MatMul can be served by one
fused onnxq op that reads the packed codes directly (only the gathered rows, or tiles of B
inside the GEMM). Each fusion rewrites its pattern in a quantized model in place, gives the
fused node a function fallback with the same bits, and returns how many nodes it fused.
`apply_fusions` runs them in table order, and again until a round fuses nothing (the outcome
does not hang on the order: a tied table's Gathers fuse once its MatMul has);
`quantize_model(fuse=True)` (the default; CLI ``--no-fuse`` turns it off) calls it after the
rewrite, before the fallbacks are embedded.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

from onnxq.graph.fuse_gather import fuse_gather
from onnxq.graph.fuse_matmul import fuse_matmul

__all__ = ["FUSIONS", "apply_fusions"]

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


def apply_fusions(model: onnx.ModelProto) -> dict[str, int]:
    """Run every fusion on ``model`` (in place), until none fuses more; how many each fused."""
    counts = dict.fromkeys(FUSIONS, 0)
    for _ in range(_MAX_ROUNDS):
        done = {name: fusion(model) for name, fusion in FUSIONS.items()}
        for name, n in done.items():
            counts[name] += n
        if not any(done.values()):
            break
    return counts
