"""`tune`: the fewest weight bits that meet an accuracy budget (``onnxq tune``).

The search itself is described in `onnxq.tuning.search`; trials in `onnxq.tuning.trials`,
where they run in `onnxq.tuning.runners`, the cache in `onnxq.tuning.cache`, the outputs in
`onnxq.tuning.report`. This module checks the arguments, runs the float model on the inputs,
runs the search, quantizes the model as chosen, measures that model on both splits and writes
the outputs (all or none).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import time
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx

from onnxq._version import __version__
from onnxq.graph.recipe import Recipe, load_recipe
from onnxq.tuning.budget import Budget, parse_budget
from onnxq.tuning.cache import TrialCache
from onnxq.tuning.data import check_against, inputs_hash, load_samples, split
from onnxq.tuning.layers import Layer, assignment_recipe, find_layers, parse_candidates
from onnxq.tuning.report import build_report, output_paths, plot_png, table_text, write_all
from onnxq.tuning.runners import make_runner
from onnxq.tuning.search import (
    HELD_OUT,
    SEARCH,
    SearchResult,
    Trials,
    bits_per_weight,
    cheapest_single,
    promote,
    run_search,
)
from onnxq.tuning.trials import TRIALS_REVISION, Context, make_session, run_outputs

__all__ = ["TuneResult", "tune"]


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """What `tune` found: the quantized model, its recipe (a mapping), the report, the files."""

    model: onnx.ModelProto
    recipe: dict[str, Any]
    report: dict[str, Any]
    files: dict[str, Path]

    def table(self) -> str:
        """The report as a terminal table."""
        return table_text(self.report)


def _load(model: str | os.PathLike[str] | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy
    path = Path(model)
    if not path.is_file():
        raise ValueError(f"model {str(path)!r} does not exist or is not a file")
    try:
        return onnx.load(str(path))
    except Exception as err:
        raise ValueError(f"{str(path)!r} is not a readable ONNX model ({err})") from None


def _float_outputs(
    model_bytes: bytes, samples: list[dict[str, np.ndarray]]
) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    """(samples cast to the model's input types, the float model's outputs on them)."""
    try:
        sess = make_session(model_bytes)
    except Exception as err:
        raise ValueError(f"onnxruntime cannot load the model: {str(err)[:300]}") from None
    samples = check_against(samples, sess.get_inputs())
    outputs = []
    for i, sample in enumerate(samples):
        try:
            outputs += run_outputs(sess, [sample])
        except Exception as err:
            first = " ".join(str(err).split())[:300]
            raise ValueError(
                f"input sample {i} does not fit the model (onnxruntime: {first}); check the "
                "input shapes and types"
            ) from None
    return samples, outputs


def _paths(
    output: str | os.PathLike[str] | None, source: Any, plot: bool, overwrite: bool
) -> dict[str, Path]:
    if output is None:
        return {}
    out = Path(output)
    if out.is_dir():
        raise ValueError(f"output {str(out)!r} is a folder; give a model file name inside it")
    if not out.parent.is_dir():
        raise ValueError(f"the output folder {str(out.parent)!r} does not exist")
    paths = output_paths(out)
    if not plot:
        paths.pop("plot")
    elif importlib.util.find_spec("matplotlib") is None:
        raise ValueError("plot needs matplotlib: pip install matplotlib")
    if isinstance(source, (str, os.PathLike)) and not overwrite:
        for p in paths.values():
            if p.exists() and os.path.samefile(p, source):
                raise ValueError(f"output {str(p)!r} is the input model; write elsewhere")
    return paths


def tune(
    model: str | os.PathLike[str] | onnx.ModelProto,
    inputs: str | os.PathLike[str] | Sequence[Mapping[str, Any]],
    budget: str | Budget | tuple[Any, ...],
    output: str | os.PathLike[str] | None = None,
    *,
    candidates: Sequence[str] | str | None = None,
    weights_only: bool = True,
    recipe: str | os.PathLike[str] | Mapping[str, Any] | Recipe | None = None,
    holdout: float = 0.25,
    workers: int = 1,
    ray: str | bool | None = None,
    cache: str | os.PathLike[str] | None = None,
    weight_storage: Literal["packed", "fake"] = "packed",
    plot: bool = False,
    progress: bool | Callable[[int, int, str], None] | None = None,
    overwrite: bool = False,
) -> TuneResult:
    """Choose a format per layer with the fewest weight bits that meets ``budget``.

    Args:
        model: the float model (a path or a ``ModelProto``, not modified).
        inputs: samples: a folder of ``.npz`` files, one ``.npz`` of stacked samples, or a
            sequence of dicts (`onnxq.tuning.data`); a fraction ``holdout`` of them is held out
            of the search and checks its result.
        budget: ``"cosine>=0.99"``, ``"sqnr>=25"``, ``"top1>=0.99"``, ``"max_abs<=0.1"``, a
            `Budget`, or ``(callable, threshold[, higher_is_better])`` with a callable
            ``(float_outputs, quant_outputs) -> float`` (lists of per-sample output dicts).
        output: where to write the quantized model; beside it ``NAME.recipe.yaml`` (for
            ``onnxq quantize --recipe``), ``NAME.tune.json`` (the report) and, with ``plot``,
            ``NAME.frontier.png``. None writes nothing.
        candidates: the formats to choose from (default mxfp4, mx6, mxfp6, mxfp8, bfp16;
            ``float`` keeps a layer float); ordered by bits per value.
        weights_only: True (default): tune the weights; activations stay as ``recipe`` says
            (float without one). False: each tuned node's activations take its layer's format.
        recipe: the starting recipe: its op types, exclusions, float overrides and modes
            decide which layers are tuned and how.
        holdout: the fraction of samples held out (every 4th at 0.25).
        workers: local worker processes for the trials (default 1: in this process).
        ray: a Ray address (``host:port``, ``ray://host:port``, ``auto``) or ``"local"`` /
            True (a Ray started on this machine, or the one already initialised): one Ray
            task per trial instead of the local pool.
        cache: a folder of finished trials, reused by later searches (`onnxq.tuning.cache`).
        weight_storage: how the written model stores weights (``packed`` or ``fake``).
        plot: also write the explored frontier as a PNG (needs matplotlib).
        progress: True draws a progress bar on stderr; a callable gets
            ``(done, total, "best B b/w, T left")``.
        overwrite: allow an output path to name the input model.

    Returns:
        A `TuneResult`.

    Raises:
        ValueError: a bad budget, metric, candidate, recipe, path or input set; inputs that do
            not fit the model; a Ray address that does not answer; a budget out of reach
            (`onnxq.tuning.search.OutOfReachError`). Nothing is written then.
    """
    started = time.monotonic()
    goal = parse_budget(budget)
    formats = parse_candidates(candidates)
    base = load_recipe(recipe) if recipe is not None else Recipe()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, not {workers!r}")
    paths = _paths(output, model, plot, overwrite)
    proto = _load(model)
    layers, untuned, _ = find_layers(proto, base)
    if not layers:
        raise ValueError(
            "nothing to tune: the recipe selects no named weight of the model (MatMul, Gemm, "
            "Conv, ... with a constant weight)"
        )
    model_bytes = proto.SerializeToString()
    samples, refs = _float_outputs(model_bytes, load_samples(inputs))
    search_idx, held_idx = split(len(samples), holdout)
    splits = {SEARCH: [samples[i] for i in search_idx], HELD_OUT: [samples[i] for i in held_idx]}
    ref = {SEARCH: [refs[i] for i in search_idx], HELD_OUT: [refs[i] for i in held_idx]}
    best = goal.evaluate(ref[SEARCH], ref[SEARCH])  # the metric of float against float
    ctx = Context(
        uuid.uuid4().hex, model_bytes, base.to_dict(), tuple(layers), weights_only, goal,
        splits, ref,
    )  # fmt: skip
    key_parts = {
        "model": hashlib.sha256(model_bytes).hexdigest(),
        "settings": {
            "recipe": base.to_json(),
            "weights_only": weights_only,
            "v": __version__,
            "trials": TRIALS_REVISION,
        },
        "metric": goal.name,
        "inputs": {k: inputs_hash(v) for k, v in splits.items()},
    }
    bar = _progress(progress)
    store = TrialCache(cache)
    runner = make_runner(ctx, workers, ray)
    try:
        result = run_search(Trials(runner, store, key_parts, bar), layers, formats, goal, best)
        label = f"ray, {runner.workers} CPUs" if ray else f"{workers} worker(s)"
    finally:
        runner.close()
        if bar is not None and hasattr(bar, "close"):
            bar.close()
    chosen, quantized, final = _written(
        proto, base, layers, formats, result, weights_only, weight_storage, splits, ref, goal
    )
    result.bits = bits_per_weight(layers, result.assignment)
    report = build_report(
        budget=goal, layers=layers, untuned=untuned, candidates=formats, result=result,
        final=final, counts={k: len(v) for k, v in splits.items()},
        settings={
            "weights_only": weights_only, "holdout": holdout, "runner": label,
            "seconds": time.monotonic() - started, "onnxq_version": __version__,
        },
    )  # fmt: skip
    _write(paths, quantized, chosen, report, goal)
    return TuneResult(quantized, chosen, report, paths)


def _progress(progress: Any) -> Any:
    if progress is None or progress is False:
        return None
    if progress is True:
        from onnxq.progress import ProgressBar

        return ProgressBar(always=True)
    if not callable(progress):
        raise TypeError(f"progress must be a bool or a callable, not {progress!r}")
    return progress


def _written(
    proto: onnx.ModelProto,
    base: Recipe,
    layers: Sequence[Layer],
    formats: Sequence[str],
    result: SearchResult,
    weights_only: bool,
    storage: str,
    splits: Mapping[str, Any],
    ref: Mapping[str, Any],
    goal: Budget,
) -> tuple[dict[str, Any], onnx.ModelProto, dict[str, float]]:
    """The recipe, model and metrics of the choice as written, repaired until it meets the budget.

    The written model is measured too; in the rare case it misses, its most damaging layer is
    promoted, never past the cheapest single format that met the budget in the trials.
    """
    single = cheapest_single(goal, result.uniform.values())
    while True:
        chosen = assignment_recipe(base, layers, result.assignment, weights_only)
        quantized, final = _final(proto, chosen, storage, splits, ref, goal)
        if all(goal.meets(v) for v in final.values()):
            return chosen, quantized, final
        if not promote(result.assignment, formats, result.damage):
            raise ValueError(
                f"budget {goal.text} is out of reach: the written model misses it ({final}) "
                "with every layer in the widest candidate; relax the budget"
            )
        if single is not None and bits_per_weight(layers, result.assignment) >= single.bits:
            result.assignment = dict(single.assignment)
            single = None  # tried once: if it misses written too, promote on from it
        result.repairs += 1


def _final(
    proto: onnx.ModelProto,
    chosen: dict[str, Any],
    storage: str,
    splits: Mapping[str, Any],
    ref: Mapping[str, Any],
    goal: Budget,
) -> tuple[onnx.ModelProto, dict[str, float]]:
    """The model quantized as chosen, and its metric on each split."""
    from onnxq.graph.quantize import quantize_model

    Recipe.from_mapping(chosen)  # the written recipe must load back
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = quantize_model(
            proto,
            recipe=chosen,
            weight_storage=storage,  # type: ignore[arg-type]
            allow_empty=True,
            custom_ops_only=bool(chosen.get("custom_ops_only", False)),
        )
    sess = make_session(quantized)
    final = {k: goal.evaluate(ref[k], run_outputs(sess, splits[k])) for k in splits}
    return quantized, final


def _write(
    paths: Mapping[str, Path],
    quantized: onnx.ModelProto,
    chosen: Mapping[str, Any],
    report: dict[str, Any],
    goal: Budget,
) -> None:
    import json

    import yaml

    if not paths:
        return
    header = (
        f"# onnxq tune: {goal.text}, {report['bits_per_weight']:.3f} bits per weight\n"
        f"# use with: onnxq quantize MODEL -o OUT --recipe {paths['recipe'].name}\n"
    )
    report["files"] = {k: str(v) for k, v in paths.items()}
    files = {
        paths["model"]: quantized.SerializeToString(),
        paths["recipe"]: (header + yaml.safe_dump(dict(chosen), sort_keys=False)).encode(),
        paths["report"]: (json.dumps(report, indent=1) + "\n").encode(),
    }
    if "plot" in paths:
        files[paths["plot"]] = plot_png(report)
    write_all(files)
