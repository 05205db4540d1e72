"""onnxq.tuning on a model whose expected assignment is known by construction (synthetic.py)."""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxq
from onnxq.compare import error_metrics
from onnxq.graph.recipe import load_recipe
from onnxq.tuning import Budget, OutOfReachError, tune
from onnxq.tuning.data import split
from onnxq.tuning.layers import bits_of, glob_escape
from onnxq.tuning.search import greedy_path
from onnxq.tuning.trials import Context, Evaluator
from tests.tuning import synthetic

BUDGET = 28.8  # dB: for b, mxfp4 (17), mxfp8 (26-27), mx6 (27.5-28) miss it, mxfp6 (29.4) meets it
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
CANDIDATES = ("mxfp4", "mx6", "mxfp6", "mxfp8", "bfp16")


def _run(path: str, data: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    # plain onnxruntime: the packed weights run through their standard-ONNX fallbacks
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return [sess.run(None, s)[0] for s in data]


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    folder = tmp_path_factory.mktemp("tune")
    data = synthetic.samples()
    result = tune(
        synthetic.model(),
        data,
        f"sqnr>={BUDGET}",
        folder / "out.onnx",
        cache=folder / "cache",
        plot=HAVE_MATPLOTLIB,
    )
    return folder, data, result


def test_expected_assignment_from_construction(searched: tuple) -> None:
    _, data, result = searched
    search_idx, _ = split(len(data), 0.25)
    search = [data[i] for i in search_idx]
    # b: the cheapest candidate whose error alone meets the budget (numpy); others exact in mxfp4
    b_fmt = next(f for f in CANDIDATES if synthetic.b_alone_sqnr(f, search) >= BUDGET)
    assert b_fmt == "mxfp6"  # the construction's intent, checked by numpy
    rows = {r["layer"]: r["format"] for r in result.report["layers"]}
    assert rows == {"a": "mxfp4", "b": b_fmt, "c": "mxfp4", "d": "mxfp4"}
    assert result.report["bits_per_weight"] == pytest.approx((3 * 4.25 + 6.25) / 4)


def test_meets_budget_on_held_out_inputs(searched: tuple) -> None:
    folder, data, result = searched
    _, held_idx = split(len(data), 0.25)
    assert held_idx == [3, 7]  # every 4th sample (the documented rule)
    held = [data[i] for i in held_idx]
    got = _run(str(folder / "out.onnx"), held)  # the written (packed) model, run here
    ref = [synthetic.chain(s["x"], synthetic.weights()) for s in held]
    measured = error_metrics(np.concatenate(ref), np.concatenate(got))["sqnr"]
    assert measured >= BUDGET
    assert result.report["held_out"]["samples"] == 2
    assert result.report["held_out"]["metric"] == pytest.approx(measured, abs=1e-3)


def test_fewer_bits_than_the_cheapest_single_format(searched: tuple) -> None:
    _, data, result = searched
    meeting = []
    for fmt in CANDIDATES:  # whole model in one format, numpy, on all samples
        ws = [onnxq.cast(w, fmt, axis=0) for w in synthetic.weights()]
        if synthetic.sqnr(ws, data) >= BUDGET:
            meeting.append(bits_of(fmt))
    assert result.report["bits_per_weight"] < min(meeting)
    single = result.report["cheapest_single_format"]
    assert single["bits_per_weight"] == min(meeting)


def test_recipe_reproduces_the_model(searched: tuple) -> None:
    folder, _, _ = searched
    written = onnx.load(str(folder / "out.onnx"))
    recipe = load_recipe(folder / "out.recipe.yaml")
    again = onnxq.quantize_model(synthetic.model(), recipe=recipe)
    assert {t.name: t.SerializeToString() for t in again.graph.initializer} == {
        t.name: t.SerializeToString() for t in written.graph.initializer
    }
    assert again.graph.SerializeToString() == written.graph.SerializeToString()


def test_report_and_plot(searched: tuple) -> None:
    folder, _, result = searched
    report = json.loads((folder / "out.tune.json").read_text())
    assert report["budget"] == "sqnr>=28.8"
    assert {p["kind"] for p in report["frontier"]} >= {"uniform", "chosen"}
    assert len(report["layers"]) == 4 and set(report["layers"][0]["sensitivity"]) == set(CANDIDATES)
    if HAVE_MATPLOTLIB:  # optional: CI installs only the test extra
        assert (folder / "out.frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "bits per weight" in result.table()


def test_cache_reused_and_widened(searched: tuple) -> None:
    folder, data, first = searched
    again = tune(synthetic.model(), data, f"sqnr>={BUDGET}", cache=folder / "cache")
    assert first.report["trials"]["run"] > 0
    assert again.report["trials"]["run"] == 0  # everything came from the cache
    assert again.report["layers"] == first.report["layers"]
    wider = tune(
        synthetic.model(),
        data,
        f"sqnr>={BUDGET}",
        cache=folder / "cache",
        candidates=[*CANDIDATES, "mx9"],
    )
    # new: mx9 alone per layer (4) and the model in mx9 (1), plus path probes it moved
    assert 5 <= wider.report["trials"]["run"] < first.report["trials"]["run"]


def test_interrupted_search_leaves_the_cache_usable(tmp_path) -> None:
    data = synthetic.samples()
    calls = []

    def stop(done: int, total: int, label: str) -> None:
        calls.append(done)
        if done >= 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tune(synthetic.model(), data, "sqnr>=28.8", tmp_path / "o.onnx", cache=tmp_path / "c",
             progress=stop)  # fmt: skip
    assert not list(tmp_path.glob("o.*")) and not list(tmp_path.glob(".o*"))
    kept = list((tmp_path / "c").rglob("*.json"))
    assert kept and all(json.loads(p.read_text())["metric"] for p in kept)
    result = tune(synthetic.model(), data, "sqnr>=28.8", cache=tmp_path / "c")
    assert result.report["trials"]["from_cache"] >= 5


def test_fast_trials_equal_the_graph_pass() -> None:
    model = synthetic.model()
    data = synthetic.samples(2)
    from onnxq.graph.recipe import Recipe
    from onnxq.tuning.layers import find_layers

    layers, _, _ = find_layers(model, Recipe())
    budget = Budget("cosine", 0.9)
    ctx = Context("t", model.SerializeToString(), Recipe().to_dict(), tuple(layers), True,
                  budget, {"search": data}, {"search": []})  # fmt: skip
    ev = Evaluator(ctx)
    assert ev.fast
    assignment = {"a": "mx6", "b": "mxfp4", "c": "float", "d": "bfp16"}
    assert ev.swappable  # main-graph initializers: swapped by the session
    swapped = ev.session(assignment)
    serialized = ort.InferenceSession(
        ev.model_bytes(assignment), providers=["CPUExecutionProvider"]
    )
    recipe = {"node_overrides": {n: {"weights": None if f == "float" else f}
                                 for n, f in assignment.items()}}  # fmt: skip
    passed = onnxq.quantize_model(model, recipe=recipe, weight_storage="fake")
    slow = ort.InferenceSession(passed.SerializeToString(), providers=["CPUExecutionProvider"])
    for s in data:
        want = slow.run(None, s)[0]
        assert np.array_equal(swapped.run(None, s)[0], want)
        assert np.array_equal(serialized.run(None, s)[0], want)
    # the float model is restored after a trial
    assert ev.model.SerializeToString() == model.SerializeToString()


def test_callable_budget_and_out_of_reach() -> None:
    data = synthetic.samples()

    def mean_cosine(ref: list, got: list) -> float:  # per sample, then the mean
        cos = [error_metrics(r["h3"], g["h3"])["cos"] for r, g in zip(ref, got, strict=True)]
        return float(np.mean(cos))

    result = tune(synthetic.model(), data, (mean_cosine, 0.999), candidates="mxfp4,bfp16")
    assert result.report["metric"].endswith("mean_cosine")
    assert result.report["held_out"]["metric"] >= 0.999
    assert result.report["layers"][0]["format"] == "mxfp4"  # a is exact in mxfp4
    with pytest.raises(OutOfReachError, match=r"out of reach.*bfp16"):
        tune(synthetic.model(), data, "sqnr>=200", candidates="mxfp4,bfp16")


def test_greedy_path_by_bits_saved_per_damage() -> None:
    from onnxq.tuning.layers import Layer

    layers = [Layer("x", ("x",), ("wx",), 100), Layer("y", ("y",), ("wy",), 100)]
    # damage per candidate (mxfp4, bfp16): x loses 0.1 in mxfp4, y 0.01: y moves first
    path = greedy_path(layers, ["mxfp4", "bfp16"], {"x": [0.1, 0.0], "y": [0.01, 0.0]})
    assert [a for a, _ in path] == [
        {"x": "bfp16", "y": "bfp16"},
        {"x": "bfp16", "y": "mxfp4"},
        {"x": "mxfp4", "y": "mxfp4"},
    ]
    assert [d for _, d in path] == pytest.approx([0.0, 0.01, 0.11])


def test_split_rule_and_glob_escape() -> None:
    assert split(8, 0.25) == ([0, 1, 2, 4, 5, 6], [3, 7])
    assert split(2, 0.25) == ([0], [1])
    assert split(10, 0.5) == ([0, 2, 4, 6, 8], [1, 3, 5, 7, 9])
    with pytest.raises(ValueError, match="at least two"):
        split(1, 0.25)
    assert glob_escape("a[1]*?") == "a[[]1][*][?]"
    assert math.isclose(bits_of("mx6"), 6.0) and bits_of("float") == 32.0


def test_recipe_exclusions_stay_float(tmp_path) -> None:
    result = tune(
        synthetic.model(), synthetic.samples(), "sqnr>=20", tmp_path / "o.onnx",
        recipe={"exclude": ["b"]},
    )  # fmt: skip
    assert [r["layer"] for r in result.report["layers"]] == ["a", "c", "d"]
    assert "b" not in result.recipe["node_overrides"] and result.recipe["exclude"] == ["b"]
    written = onnx.load(str(tmp_path / "o.onnx"))
    w1 = next(t for t in written.graph.initializer if t.name == "w1")
    assert np.array_equal(onnx.numpy_helper.to_array(w1), synthetic.weights()[1])  # float


def test_weights_and_activations(tmp_path) -> None:
    model = synthetic.model()
    for value in (*model.graph.input, *model.graph.output):  # static shapes for activations
        value.type.tensor_type.shape.dim[0].dim_value = 8
    result = tune(
        model, synthetic.samples(4), "cosine>=0.99", tmp_path / "o.onnx",
        candidates="mxfp8,bfp16", weights_only=False,
    )  # fmt: skip
    assert all("activations" in o for o in result.recipe["node_overrides"].values())
    written = onnx.load(str(tmp_path / "o.onnx"))
    assert any(n.op_type in ("QuantizeMX", "QuantizeDequantizeMX") for n in written.graph.node)
    assert result.report["held_out"]["metric"] >= 0.99
