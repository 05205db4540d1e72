"""Choosing a format per layer automatically under an accuracy budget (``onnxq tune``).

`tune` measures each layer's sensitivity to each candidate format, orders the assignments by
weight bits saved per unit of damage, finds the cheapest one that meets the budget with
whole-model trials, checks it on held-out inputs and writes the model, its recipe and a report.
Trials run in this process, on a local process pool (``workers``) or on a Ray cluster (``ray``),
and are cached on disk (``cache``). The modules: `budget` (metrics and bounds), `data` (samples
and the split), `layers` (what is tuned, recipes), `trials` (one trial), `runners` (where
trials run), `cache`, `search` (the method), `report` (outputs), `api` (`tune`).
"""

from onnxq.tuning.api import TuneResult, tune
from onnxq.tuning.budget import METRICS, Budget, parse_budget
from onnxq.tuning.layers import DEFAULT_CANDIDATES
from onnxq.tuning.search import OutOfReachError

__all__ = [
    "DEFAULT_CANDIDATES",
    "METRICS",
    "Budget",
    "OutOfReachError",
    "TuneResult",
    "parse_budget",
    "tune",
]
