"""Which fusions run (onnxq.graph.fuse): the default set, and ``fuse`` in its every form.

By default only the fusions that never cost speed run (``DEFAULT_FUSIONS``: GatherMX);
MatMulMX is opt-in (``fuse="all"`` or a list naming ``matmul_mx``), from ``quantize_model``,
the recipe key ``fuse`` and the CLI (tests/cli). Checked on the embedding model (a Gather of a
table, then a MatMul projection): which onnxq ops each form leaves, the ``onnxq_fused``
metadata, the activation nodes, and the one-line errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from onnxq.graph.fuse import DEFAULT_FUSIONS, FUSIONS, apply_fusions, fusion_names
from onnxq.graph.quantize import quantize_model
from onnxq.graph.recipe import Recipe, load_recipe
from tests.models import builders


def _ops(model: onnx.ModelProto) -> list[str]:
    return sorted(n.op_type for n in model.graph.node)


def _fused_meta(model: onnx.ModelProto) -> dict[str, int]:
    meta = {p.key: p.value for p in model.metadata_props}
    return json.loads(meta["onnxq_fused"]) if "onnxq_fused" in meta else {}


def test_the_default_is_gather_only() -> None:
    assert DEFAULT_FUSIONS == ("gather",)
    assert set(DEFAULT_FUSIONS) <= set(FUSIONS)


@pytest.mark.parametrize(
    ("fuse", "names"),
    [
        (True, ("gather",)),
        (False, ()),
        ("all", ("matmul_mx", "gather")),
        (" all ", ("matmul_mx", "gather")),
        ("gather", ("gather",)),
        ("gather,matmul_mx", ("matmul_mx", "gather")),  # table order, whatever the order given
        (["gather", "matmul_mx"], ("matmul_mx", "gather")),
        (("matmul_mx",), ("matmul_mx",)),
        ([], ()),
    ],
)
def test_fusion_names(fuse: bool | str | list[str], names: tuple[str, ...]) -> None:
    assert fusion_names(fuse) == names


@pytest.mark.parametrize(
    ("fuse", "word"),
    [
        ("nope", "unknown fusion 'nope'"),
        (["gather", "matmul"], "unknown fusion 'matmul'"),
        (3, "got 3"),
        ([1], "expected true, false, 'all'"),
    ],
)
def test_bad_fusion_names_are_refused_in_one_line(fuse: object, word: str) -> None:
    with pytest.raises(ValueError) as err:
        fusion_names(fuse)  # type: ignore[arg-type]
    text = str(err.value)
    assert len(text.splitlines()) == 1 and word in text, text
    assert "matmul_mx, gather" in text  # names the known ones


def test_apply_fusions_runs_only_the_named_ones() -> None:
    model, _ = builders.embedding()
    plain = quantize_model(model, weights="mxfp4", fuse=False)
    default = onnx.ModelProto()
    default.CopyFrom(plain)
    assert apply_fusions(default) == {"gather": 1}
    assert "GatherMX" in _ops(default) and "MatMulMX" not in _ops(default)
    every = onnx.ModelProto()
    every.CopyFrom(plain)
    assert apply_fusions(every, tuple(FUSIONS)) == {"matmul_mx": 1, "gather": 1}
    assert "GatherMX" in _ops(every) and "MatMulMX" in _ops(every)


@pytest.mark.parametrize(
    ("fuse", "ops", "meta"),
    [
        (True, ["DequantizeMX", "GatherMX", "MatMul"], {"gather": 1}),
        (["gather"], ["DequantizeMX", "GatherMX", "MatMul"], {"gather": 1}),
        ("all", ["GatherMX", "MatMulMX"], {"matmul_mx": 1, "gather": 1}),
        ("matmul_mx,gather", ["GatherMX", "MatMulMX"], {"matmul_mx": 1, "gather": 1}),
        (["matmul_mx"], ["DequantizeMX", "Gather", "MatMulMX"], {"matmul_mx": 1}),
        ([], ["DequantizeMX", "DequantizeMX", "Gather", "MatMul"], {}),
        (False, ["DequantizeMX", "DequantizeMX", "Gather", "MatMul"], {}),
    ],
)
def test_quantize_model_fuse_forms(
    fuse: bool | str | list[str], ops: list[str], meta: dict[str, int]
) -> None:
    model, _ = builders.embedding()
    q = quantize_model(model, weights="mxfp4", fuse=fuse)
    assert _ops(q) == ops
    assert _fused_meta(q) == meta


@pytest.mark.parametrize(("fuse", "pair"), [(True, False), ([], False), (False, True)])
def test_activations_are_one_node_unless_fuse_is_false(fuse: bool | list[str], pair: bool) -> None:
    model, _ = builders.mlp()
    ops = _ops(quantize_model(model, weights="mxfp4", activations="mxfp8", fuse=fuse))
    assert ("QuantizeMX" in ops) == pair
    assert ("QuantizeDequantizeMX" in ops) == (not pair)


def test_a_bad_fusion_name_fails_before_any_work() -> None:
    with pytest.raises(ValueError, match="unknown fusion 'gemm'; known: matmul_mx, gather"):
        quantize_model("/nonexistent/model.onnx", weights="mxfp4", fuse="gemm")


@pytest.mark.parametrize(
    ("recipe_fuse", "arg", "meta"),
    [
        ("all", True, {"matmul_mx": 1, "gather": 1}),  # the argument left at its default
        (["matmul_mx"], True, {"matmul_mx": 1}),
        ("all", ["gather"], {"gather": 1}),  # an explicit argument wins
        (False, "all", {}),  # False from either wins
        ("all", False, {}),
    ],
)
def test_recipe_fuse_and_the_argument(
    recipe_fuse: bool | str | list[str], arg: bool | str | list[str], meta: dict[str, int]
) -> None:
    model, _ = builders.embedding()
    q = quantize_model(model, recipe={"weights": "mxfp4", "fuse": recipe_fuse}, fuse=arg)
    assert _fused_meta(q) == meta


@pytest.mark.parametrize(
    ("value", "stored", "written"),
    [
        (True, True, None),
        (False, False, False),
        ("all", "all", "all"),
        (["gather"], ("gather",), ["gather"]),
        ("gather, matmul_mx", ("matmul_mx", "gather"), ["matmul_mx", "gather"]),
        ([], (), []),
    ],
)
def test_recipe_fuse_round_trips(
    value: bool | str | list[str], stored: object, written: object, tmp_path: Path
) -> None:
    recipe = Recipe.from_mapping({"weights": "mxfp4", "fuse": value})
    assert recipe.fuse == stored
    data = recipe.to_dict()
    assert data.get("fuse") == written  # True (the default) is not written
    assert Recipe.from_mapping(data) == recipe
    path = tmp_path / "r.json"
    path.write_text(recipe.to_json())
    assert load_recipe(path) == recipe


@pytest.mark.parametrize(
    ("value", "word"),
    [("gemm", "recipe.fuse: unknown fusion 'gemm'"), (1, "recipe.fuse: expected true, false")],
)
def test_bad_recipe_fuse_is_one_line(value: object, word: str) -> None:
    with pytest.raises(ValueError) as err:
        Recipe.from_mapping({"fuse": value})
    assert len(str(err.value).splitlines()) == 1 and word in str(err.value)


@pytest.mark.parametrize("value", ["all", ["matmul_mx"], False])
def test_tuning_keeps_the_recipes_fuse(value: bool | str | list[str]) -> None:
    """`onnxq tune` writes its recipe from the starting one: the ``fuse`` choice carries."""
    from onnxq.tuning.layers import assignment_recipe

    base = Recipe.from_mapping({"weights": "mxfp4", "fuse": value})
    written = assignment_recipe(base, [], {}, weights_only=True)
    assert written["fuse"] == value
    assert Recipe.from_mapping(written).fuse == base.fuse
