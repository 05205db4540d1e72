"""The accuracy budget of a search: a metric of the outputs against float and its bound.

A budget is written ``cosine>=0.99``, ``sqnr>=25``, ``top1>=0.98`` (floors) or
``max_abs<=0.05`` (a ceiling), or given in Python as any callable
``(float_outputs, quant_outputs) -> float`` with a threshold. Built-in metrics are those of
`onnxq.compare`: each float output of the model is pooled over the samples of a split (their
values concatenated), measured against float, and the worst output counts. A callable gets
the whole split at once: two lists, one entry per sample, each a dict output name -> array.

For the search, a metric value is turned into an additive *damage* (0 for float): 1 - cosine,
the noise-to-signal power ratio 10^(-SQNR/10), 1 - top-1, max abs error, or the distance from
the callable's value on float outputs. Damages of layers quantized one at a time are summed to
predict a whole assignment (`onnxq.tuning.search`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from onnxq.compare import error_metrics, top1_agreement

__all__ = ["METRICS", "Budget", "Outputs", "parse_budget"]

Outputs = Sequence[Mapping[str, np.ndarray]]  # one dict (output name -> array) per sample
MetricFn = Callable[[Outputs, Outputs], float]

# name -> (higher is better, compare key); the metrics onnxq.compare offers
METRICS: dict[str, bool] = {"cosine": True, "sqnr": True, "top1": True, "max_abs": False}
_ALIASES = {"cos": "cosine", "snr": "sqnr", "top-1": "top1", "maxabs": "max_abs"}
_EXPR = re.compile(r"^\s*([A-Za-z_][\w-]*)\s*(>=|<=)\s*([-+]?[0-9.]+(?:[eE][-+]?\d+)?)\s*$")


def _known() -> str:
    return "cosine, sqnr, top1 (floors: NAME>=X) and max_abs (a ceiling: max_abs<=X)"


@dataclasses.dataclass(frozen=True)
class Budget:
    """A bound on a quality metric of the quantized outputs against the float outputs.

    Attributes:
        metric: a built-in metric name (`METRICS`) or a callable
            ``(float_outputs, quant_outputs) -> float``.
        threshold: the bound the metric must meet.
        higher_is_better: True for floors (``>=``), False for ceilings (``<=``); built-in
            metrics set it themselves.
        name: how reports and cache keys name the metric (a callable's qualified name by
            default: rename a callable whose code changes, or clear the cache).
    """

    metric: str | MetricFn
    threshold: float
    higher_is_better: bool = True
    name: str = ""

    def __post_init__(self) -> None:
        """Check the metric and the threshold."""
        if isinstance(self.metric, str):
            key = _ALIASES.get(self.metric.lower(), self.metric.lower())
            if key not in METRICS:
                raise ValueError(f"unknown metric {self.metric!r}; known metrics: {_known()}")
            object.__setattr__(self, "metric", key)
            object.__setattr__(self, "higher_is_better", METRICS[key])
            object.__setattr__(self, "name", key)
        elif callable(self.metric):
            if not self.name:
                fn = self.metric
                label = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"
                object.__setattr__(self, "name", label.strip("."))
        else:
            raise TypeError(f"budget metric must be a name or a callable, not {self.metric!r}")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)):
            raise ValueError(f"budget threshold must be a number, not {self.threshold!r}")
        if not math.isfinite(float(self.threshold)):
            raise ValueError(f"budget threshold must be finite, not {self.threshold!r}")
        object.__setattr__(self, "threshold", float(self.threshold))

    @property
    def text(self) -> str:
        """The budget as the CLI writes it, e.g. ``cosine>=0.99``."""
        return f"{self.name}{'>=' if self.higher_is_better else '<='}{self.threshold:g}"

    def evaluate(self, ref: Outputs, got: Outputs) -> float:
        """The metric of ``got`` against ``ref`` (NaN when the outputs are not comparable)."""
        if callable(self.metric):
            return float(self.metric(ref, got))
        return _builtin(str(self.metric), ref, got)

    def meets(self, value: float) -> bool:
        """True when ``value`` is within the budget (NaN never is)."""
        if math.isnan(value):
            return False
        return value >= self.threshold if self.higher_is_better else value <= self.threshold

    def damage(self, value: float, best: float) -> float:
        """An additive cost of ``value`` (0 at ``best``, the metric of float against float)."""
        if math.isnan(value):
            return math.inf
        return max(self._to_damage(value) - self._to_damage(best), 0.0)

    def predicted(self, damage: float, best: float) -> float:
        """The metric value a summed ``damage`` predicts (the inverse of `damage`)."""
        total = damage + self._to_damage(best)
        if self.metric == "cosine" or self.metric == "top1":
            return 1.0 - total
        if self.metric == "sqnr":
            return math.inf if total <= 0 else -10.0 * math.log10(total)
        return -total if self.higher_is_better else total

    def _to_damage(self, value: float) -> float:
        if self.metric == "cosine" or self.metric == "top1":
            return 1.0 - value
        if self.metric == "sqnr":
            return 0.0 if value == math.inf else 10.0 ** (-value / 10.0)
        return -value if self.higher_is_better else value


def _pooled(runs: Outputs, name: str) -> np.ndarray:
    return np.concatenate([np.asarray(r[name], np.float64).ravel() for r in runs])


def _builtin(metric: str, ref: Outputs, got: Outputs) -> float:
    """A built-in metric, worst over the float outputs, each pooled over the samples."""
    if len(ref) != len(got) or not ref:
        return math.nan
    names = [n for n, a in ref[0].items() if np.issubdtype(np.asarray(a).dtype, np.floating)]
    if metric == "top1":
        names = [n for n in names if np.ndim(ref[0][n]) >= 2 and np.shape(ref[0][n])[-1] >= 2]
    if not names:
        raise ValueError(
            f"metric {metric!r} needs a float output"
            + (" with a class axis last (rank >= 2)" if metric == "top1" else "")
            + "; the model has none: use another metric or a callable budget"
        )
    values = []
    for name in names:
        if metric == "top1":
            a = np.concatenate([np.asarray(r[name]).reshape(-1, r[name].shape[-1]) for r in ref])
            b = np.concatenate([np.asarray(r[name]).reshape(-1, r[name].shape[-1]) for r in got])
            values.append(top1_agreement(a, b))
            continue
        a, b = _pooled(ref, name), _pooled(got, name)
        if a.shape != b.shape:
            return math.nan
        if not np.all(np.isfinite(b)) and np.all(np.isfinite(a)):
            return math.nan  # a quantized NaN/Inf output fails any budget
        m = error_metrics(a, b)
        values.append({"cosine": m["cos"], "sqnr": m["sqnr"], "max_abs": m["max_abs"]}[metric])
    return min(values) if METRICS[metric] else max(values)


def parse_budget(text: str | Budget | tuple[Any, ...]) -> Budget:
    """A `Budget` from ``NAME>=X`` / ``NAME<=X``, a `Budget`, or ``(callable, threshold)``.

    Raises:
        ValueError: an unknown metric, a malformed expression, or a bound in the wrong
            direction (``cosine<=0.9``); the message lists the known metrics.
    """
    if isinstance(text, Budget):
        return text
    if isinstance(text, tuple):
        if len(text) not in (2, 3) or not callable(text[0]):
            raise ValueError("a budget tuple is (callable, threshold[, higher_is_better])")
        return Budget(text[0], *text[1:])
    if not isinstance(text, str):
        raise TypeError(f"budget must be a string, a Budget or a tuple, not {text!r}")
    match = _EXPR.match(text)
    if match is None:
        raise ValueError(
            f"budget {text!r} is not METRIC>=NUMBER or METRIC<=NUMBER (e.g. cosine>=0.99, "
            f"sqnr>=25); known metrics: {_known()}"
        )
    name, op, value = match.groups()
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in METRICS:
        raise ValueError(f"unknown metric {name!r} in budget {text!r}; known metrics: {_known()}")
    if (op == ">=") != METRICS[key]:
        want = ">=" if METRICS[key] else "<="
        raise ValueError(
            f"budget {text!r}: {key} is {'a floor' if METRICS[key] else 'a ceiling'}; "
            f"write {key}{want}{value}"
        )
    try:
        threshold = float(value)
    except ValueError:
        raise ValueError(f"budget {text!r}: {value!r} is not a number") from None
    return Budget(key, threshold)
