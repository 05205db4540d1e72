"""The search: sensitivities, a greedy path of assignments, the cheapest one within budget.

1. **Uniform and sensitivity trials** (independent, run together): the whole model in each
   candidate (on the search and held-out inputs), and each layer alone in each candidate with
   every other layer float (search inputs). If even the widest candidate misses the budget on
   either split, the budget is out of reach (`OutOfReachError`).
2. **Greedy path.** From every layer in the widest candidate, repeatedly move the one layer to
   the cheaper candidate with the most weight bits saved per unit of predicted damage
   (`Budget.damage` of its sensitivity, summed over layers), until every layer is in the
   cheapest candidate. Moves that cost nothing come first.
3. **Verified search along the path.** The cheapest point of the path that meets the budget on
   the search inputs is found by measuring whole-model trials: a k-ary search (k = 3 probes a
   round, run side by side; fixed, so that every runner and worker count probes the same
   points and gets the same result) between the widest point (meets it) and the first point
   known to miss it. The result, or a cheaper uniform assignment that meets the budget,
   is chosen.
4. **Held-out check and repair.** The choice is measured on the held-out inputs; while it
   misses the budget on either split, the layer with the largest sensitivity damage in its
   current format is promoted to the next wider candidate and the assignment measured again.
   A repair never reaches the bits per weight of the cheapest uniform assignment that met the
   budget on both splits in step 1 (`cheapest_single`): that one is taken instead, so the
   result never has more bits than the cheapest passing single format. The report says how
   many repairs the held-out inputs caused (they then took part in the choice).

Every whole-model trial is a point of the explored frontier (bits per weight against the
metric). `Trials` runs the jobs through a runner, a cache and the progress bar.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from onnxq.tuning.budget import Budget
from onnxq.tuning.cache import TrialCache, key_of
from onnxq.tuning.layers import Layer, bits_of
from onnxq.tuning.runners import Runner
from onnxq.tuning.trials import Job

__all__ = [
    "OutOfReachError",
    "Point",
    "SearchResult",
    "Trials",
    "bits_per_weight",
    "cheapest_single",
    "run_search",
]

SEARCH, HELD_OUT = "search", "held_out"
PROBES = 3  # whole-model trials per round of the path search
Assignment = dict[str, str]


class OutOfReachError(ValueError):
    """Even the widest candidate misses the budget."""


@dataclasses.dataclass
class Point:
    """One whole-model trial: its assignment, bits per weight and metric per split."""

    kind: str  # uniform, path, rejected (missed the budget, repaired), chosen
    assignment: Assignment
    bits: float
    search: float | None = None
    held_out: float | None = None
    predicted: float | None = None
    label: str = ""


@dataclasses.dataclass
class SearchResult:
    """What the search found (see `run_search`)."""

    assignment: Assignment
    bits: float
    search: float
    held_out: float
    sensitivity: dict[str, dict[str, float]]  # layer -> candidate -> metric (layer alone)
    damage: dict[str, list[float]]  # layer -> damage per candidate
    points: list[Point]
    repairs: int
    trials_run: int
    trials_cached: int
    uniform: dict[str, Point]


def bits_per_weight(layers: Sequence[Layer], assignment: Mapping[str, str]) -> float:
    """Weight bits of ``assignment`` over the tuned layers' weight values."""
    total = sum(layer.size for layer in layers)
    bits = sum(layer.size * bits_of(assignment[layer.name]) for layer in layers)
    return bits / total if total else 0.0


def _fmt_time(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Trials:
    """Runs jobs through the runner, skipping those the cache or this search already has."""

    def __init__(
        self,
        runner: Runner,
        cache: TrialCache,
        key_parts: Mapping[str, Any],
        progress: Callable[[int, int, str], None] | None,
    ) -> None:
        """Keys combine ``key_parts`` (model, settings, metric, inputs per split) and the job."""
        self.runner = runner
        self.cache = cache
        self.key_parts = key_parts
        self.progress = progress
        self.memo: dict[tuple[tuple[tuple[str, str], ...], str], float] = {}
        self.run = self.cached = self.done = self.total = 0
        self.best: float | None = None
        self.started = time.monotonic()

    def _key(self, assignment: tuple[tuple[str, str], ...], split: str) -> str:
        parts = dict(self.key_parts)
        parts["inputs"] = parts["inputs"][split]
        return key_of({**parts, "assignment": assignment, "split": split})

    def _tick(self) -> None:
        if self.progress is None:
            return
        label = f"best {self.best:.2f} b/w" if self.best is not None else "sensitivity"
        if self.run and self.done < self.total:
            per = (time.monotonic() - self.started) / self.run
            label += f", {_fmt_time(per * (self.total - self.done))} left"
        self.progress(self.done, max(self.total, self.done), label)

    def measure(
        self, wanted: Sequence[tuple[Mapping[str, str], Sequence[str]]]
    ) -> list[dict[str, float]]:
        """The metric of each (assignment, splits) pair, running only what is not known."""
        keys = [tuple(sorted(a.items())) for a, _ in wanted]
        self.total += len(wanted)
        jobs: list[Job] = []
        for key, (_, splits) in zip(keys, wanted, strict=True):
            missing = []
            for split in splits:
                if (key, split) in self.memo:
                    continue
                hit = self.cache.get(self._key(key, split))
                if hit is None:
                    missing.append(split)
                else:
                    self.memo[(key, split)] = hit
            if missing:
                job = Job(key, tuple(missing))
                if job not in jobs:
                    jobs.append(job)
        self.done += len(wanted) - len(jobs)
        self.cached += len(wanted) - len(jobs)
        self._tick()

        def finished(i: int, result: dict[str, float]) -> None:
            job = jobs[i]
            for split, value in result.items():
                self.memo[(job.assignment, split)] = value
                about = {"assignment": dict(job.assignment), "split": split}
                self.cache.put(self._key(job.assignment, split), value, about)
            self.run += 1
            self.done += 1
            self._tick()

        self.runner.map(jobs, finished)
        return [
            {s: self.memo[(key, s)] for s in splits}
            for key, (_, splits) in zip(keys, wanted, strict=True)
        ]


def greedy_path(
    layers: Sequence[Layer], candidates: Sequence[str], damage: Mapping[str, Sequence[float]]
) -> list[tuple[Assignment, float]]:
    """Assignments from all-widest to all-cheapest with their predicted summed damage."""
    bits = [bits_of(c) for c in candidates]
    state = {layer.name: len(candidates) - 1 for layer in layers}

    def snapshot() -> tuple[Assignment, float]:
        total = sum(damage[n][i] for n, i in state.items())
        return {n: candidates[i] for n, i in state.items()}, total

    path = [snapshot()]
    while True:
        best: tuple[float, float, int] | None = None
        move = None
        for order, layer in enumerate(layers):
            cur = state[layer.name]
            for c in range(cur):
                saved = layer.size * (bits[cur] - bits[c])
                if saved <= 0:
                    continue
                extra = damage[layer.name][c] - damage[layer.name][cur]
                score = math.inf if extra <= 0 else saved / extra
                rank = (score, saved, -order)
                if best is None or rank > best:
                    best, move = rank, (layer.name, c)
        if move is None:
            return path
        state[move[0]] = move[1]
        path.append(snapshot())


def _walk(
    trials: Trials,
    budget: Budget,
    path: Sequence[tuple[Assignment, float]],
    last_passes: bool,
) -> tuple[int, dict[int, float]]:
    """The index of the cheapest point of ``path`` found to meet the budget (k-ary search)."""
    measured: dict[int, float] = {}
    lo, hi = 0, len(path)
    if last_passes:
        return len(path) - 1, measured
    hi = len(path) - 1
    while hi - lo > 1:
        k = min(PROBES, hi - lo - 1)
        probes = sorted({lo + round((hi - lo) * (j + 1) / (k + 1)) for j in range(k)})
        probes = [p for p in probes if lo < p < hi]
        results = trials.measure([(path[p][0], (SEARCH,)) for p in probes])
        for p, r in zip(probes, results, strict=True):
            measured[p] = r[SEARCH]
        for p in probes:
            if budget.meets(measured[p]):
                lo = p
            else:
                hi = p
                break
    return lo, measured


def _sensitivities(
    trials: Trials, layers: Sequence[Layer], candidates: Sequence[str]
) -> tuple[dict[str, Point], dict[str, dict[str, float]]]:
    """Uniform trials (both splits) and per-layer trials (search split), run together."""
    floats = {layer.name: "float" for layer in layers}
    wanted: list[tuple[Assignment, tuple[str, ...]]] = [
        ({n: c for n in floats}, (SEARCH, HELD_OUT)) for c in candidates
    ]
    wanted += [({**floats, layer.name: c}, (SEARCH,)) for layer in layers for c in candidates]
    results = trials.measure(wanted)
    uniform = {}
    for c, r in zip(candidates, results, strict=False):
        a = {n: c for n in floats}
        uniform[c] = Point("uniform", a, bits_of(c), r[SEARCH], r[HELD_OUT], label=c)
    sens: dict[str, dict[str, float]] = {}
    rest = iter(results[len(candidates) :])
    for layer in layers:
        sens[layer.name] = {c: next(rest)[SEARCH] for c in candidates}
    return uniform, sens


def _out_of_reach(budget: Budget, widest: Point) -> OutOfReachError:
    def show(v: float | None) -> str:
        return "nan" if v is None or math.isnan(v) else f"{v:.6g}"

    return OutOfReachError(
        f"budget {budget.text} is out of reach: with every layer in {widest.label} (the widest "
        f"candidate) {budget.name} is {show(widest.search)} on the search inputs and "
        f"{show(widest.held_out)} on the held-out ones; relax the budget or add a wider "
        "candidate (e.g. float)"
    )


def cheapest_single(budget: Budget, uniform: Iterable[Point]) -> Point | None:
    """The uniform point with the fewest bits that meets ``budget`` on both splits, if any."""
    meeting = [
        p
        for p in uniform
        if budget.meets(math.nan if p.search is None else p.search)
        and budget.meets(math.nan if p.held_out is None else p.held_out)
    ]
    return min(meeting, key=lambda p: p.bits) if meeting else None


def promote(
    choice: Assignment, candidates: Sequence[str], damage: Mapping[str, Sequence[float]]
) -> bool:
    """Move the layer with the largest damage to its next wider candidate (False: none left)."""
    index = {c: i for i, c in enumerate(candidates)}
    movable = [n for n, c in choice.items() if index[c] < len(candidates) - 1]
    if not movable:
        return False
    worst = max(movable, key=lambda n: (damage[n][index[choice[n]]], -len(n)))
    choice[worst] = candidates[index[choice[worst]] + 1]
    return True


def run_search(
    trials: Trials,
    layers: Sequence[Layer],
    candidates: Sequence[str],
    budget: Budget,
    best: float,
) -> SearchResult:
    """Find the assignment with the fewest weight bits that meets ``budget`` (module doc).

    Raises:
        OutOfReachError: even the widest candidate misses the budget on some split.
    """
    uniform, sens = _sensitivities(trials, layers, candidates)
    widest = uniform[candidates[-1]]
    if not (budget.meets(widest.search) and budget.meets(widest.held_out)):
        raise _out_of_reach(budget, widest)
    passing = [p for p in uniform.values() if budget.meets(p.search)]
    trials.best = min(p.bits for p in passing)
    damage = {n: [budget.damage(v[c], best) for c in candidates] for n, v in sens.items()}
    path = greedy_path(layers, candidates, damage)
    cheapest = uniform[candidates[0]]
    lo, measured = _walk(trials, budget, path, budget.meets(cheapest.search))
    points = list(uniform.values())
    for i, value in measured.items():
        a, dmg = path[i]
        points.append(
            Point("path", a, bits_per_weight(layers, a), value, None, budget.predicted(dmg, best))
        )
    choice = dict(path[lo][0])
    cheaper = min(passing, key=lambda p: p.bits)
    if cheaper.bits < bits_per_weight(layers, choice):
        choice = dict(cheaper.assignment)
    fallback = cheapest_single(budget, uniform.values())
    assert fallback is not None  # the widest meets both splits (checked above)
    repairs = 0
    while True:
        if bits_per_weight(layers, choice) >= fallback.bits:  # never above a passing format
            choice = dict(fallback.assignment)
        trials.best = bits_per_weight(layers, choice)
        (r,) = trials.measure([(choice, (SEARCH, HELD_OUT))])
        if budget.meets(r[SEARCH]) and budget.meets(r[HELD_OUT]):
            break
        points.append(Point("rejected", dict(choice), trials.best, r[SEARCH], r[HELD_OUT]))
        if not promote(choice, candidates, damage):
            raise _out_of_reach(budget, widest)
        repairs += 1
    final = Point("chosen", dict(choice), trials.best, r[SEARCH], r[HELD_OUT])
    points.append(final)
    return SearchResult(
        assignment=choice,
        bits=final.bits,
        search=r[SEARCH],
        held_out=r[HELD_OUT],
        sensitivity=sens,
        damage=damage,
        points=points,
        repairs=repairs,
        trials_run=trials.run,
        trials_cached=trials.cached,
        uniform=uniform,
    )
