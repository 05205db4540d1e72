"""`onnxq.graph.recipe` on its own: loading recipes and presets, op types, resolving, errors.

Expected values are written by hand from the recipe files in ``onnxq/recipes/`` and from the
schema in the module doc; no model is quantized here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onnxq.formats.datatype import datatype
from onnxq.graph.plan import ROLES
from onnxq.graph.recipe import (
    DEFAULT_OP_TYPES,
    KEEP_FLOAT,
    SUPPORTED_OP_TYPES,
    Override,
    Recipe,
    deployment_presets,
    deployment_recipe,
    load_recipe,
)

# From onnxq/recipes/*.yaml: (weights, activations); all use even/floor on MatMul, Gemm, Conv.
PRESETS = {
    "bfp16-deploy": ("int8_e8m0_t16", "int8_e8m0_t16"),
    "mx6-deploy": ("int5_e8m0_t16s2", "int8_e8m0_t16s2"),
    "mx9-deploy": ("int8_e8m0_t16s2", "int8_e8m0_t16s2"),
    "mxfp8-deploy": ("e4m3fn_e8m0_t32", "e4m3fn_e8m0_t32"),
}


def test_supported_op_types_are_the_op_role_table() -> None:
    # Every op type with a role is a default target too (RNN joined LSTM and GRU).
    every = ("MatMul", "Gemm", "Conv", "ConvTranspose", "LSTM", "GRU", "RNN", "Gather")
    assert SUPPORTED_OP_TYPES == every
    assert SUPPORTED_OP_TYPES == tuple(ROLES)
    assert DEFAULT_OP_TYPES == every
    assert set(DEFAULT_OP_TYPES) <= set(SUPPORTED_OP_TYPES)


def test_defaults() -> None:
    r = Recipe()
    # No scale mode set: weights get the search, activations floor (resolve, below).
    assert (r.weights, r.activations, r.round_mode, r.scale_mode) == (None, None, "even", None)
    assert r.weight_scale_mode is None
    assert r.op_types == DEFAULT_OP_TYPES
    assert not r.sets_a_format()
    assert not r.custom_ops_only


def test_presets_are_the_shipped_files() -> None:
    presets = deployment_presets()
    assert list(presets) == sorted(PRESETS)
    for name, path in presets.items():
        assert path.name == f"{name}.yaml" and path.parent.name == "recipes" and path.is_file()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_contents(name: str) -> None:
    recipe = load_recipe(deployment_presets()[name])
    assert recipe == deployment_recipe(name)
    assert (recipe.weights.code, recipe.activations.code) == PRESETS[name]
    assert (recipe.round_mode, recipe.scale_mode) == ("even", "floor")
    assert recipe.op_types == ("MatMul", "Gemm", "Conv")
    assert recipe.exclude == () and recipe.op_type_overrides == () and recipe.node_overrides == ()


def test_bfp16_block_size() -> None:
    recipe = deployment_recipe("bfp16-deploy", block_size=8)
    assert recipe.weights.code == recipe.activations.code == "int8_e8m0_t8"
    with pytest.raises(ValueError, match="has no BFP16 format"):
        deployment_recipe("mx9-deploy", block_size=8)
    for bad in (3, 1, 2048, True):
        with pytest.raises(ValueError, match="power of two"):
            deployment_recipe("bfp16-deploy", block_size=bad)
    with pytest.raises(ValueError, match="unknown deployment preset 'nope'"):
        deployment_recipe("nope")


def test_yaml_and_json_files_load_the_same(tmp_path: Path) -> None:
    data = {
        "weights": "mxfp4",
        "activations": "mxfp8e4",
        "round_mode": "away",
        "op_types": ["MatMul"],
        "add_op_types": ["RNN", "MatMul"],
        "exclude": ["head*"],
        "op_type_overrides": {"MatMul": {"activations": None}},
        "node_overrides": {"layer0/*": {"weights": "mx6", "weight_axis": 0}},
    }
    (tmp_path / "r.json").write_text(json.dumps(data))
    (tmp_path / "r.yaml").write_text(
        "weights: mxfp4\nactivations: mxfp8e4\nround_mode: away\nop_types: [MatMul]\n"
        "add_op_types: [RNN, MatMul]\nexclude: ['head*']\n"
        "op_type_overrides:\n  MatMul: {activations: null}\n"
        "node_overrides:\n  'layer0/*': {weights: mx6, weight_axis: 0}\n"
    )
    from_json = load_recipe(tmp_path / "r.json")
    assert from_json == load_recipe(tmp_path / "r.yaml") == load_recipe(data)
    assert from_json.op_types == ("MatMul", "RNN")
    assert from_json.weights == datatype("mxfp4")
    assert from_json.op_type_overrides == (("MatMul", Override(activations=KEEP_FLOAT)),)
    assert from_json.node_overrides == (
        ("layer0/*", Override(weights=datatype("mx6"), weight_axis=0)),
    )
    assert load_recipe(from_json) is from_json
    assert Recipe.from_mapping(json.loads(from_json.to_json())) == from_json


def test_remove_op_types_and_custom_ops_only() -> None:
    r = load_recipe({"weights": "mxfp4", "remove_op_types": ["Gather", "LSTM"]})
    assert r.op_types == ("MatMul", "Gemm", "Conv", "ConvTranspose", "GRU", "RNN")
    assert load_recipe({"weights": "mxfp4", "custom_ops_only": True}).custom_ops_only
    assert "custom_ops_only" not in Recipe().to_dict()


def test_resolve_layers_overrides_in_order() -> None:
    r = load_recipe(
        {
            "weights": "mxfp4",
            "activations": "mxfp8e4",
            "exclude": ["head"],
            "op_type_overrides": {"Gemm": {"weights": "mx9", "activations": None}},
            "node_overrides": {"l*": {"round_mode": "zero"}, "l1": {"activation_axis": 0}},
        }
    )
    assert r.resolve("Softmax", "x") is None
    assert r.resolve("MatMul", "head") is None
    plain = r.resolve("MatMul", "m")
    assert plain == Override(
        weights=datatype("mxfp4"),
        activations=datatype("mxfp8e4"),
        round_mode="even",
        scale_mode="floor",
        weight_scale_mode="search",
    )
    gemm = r.resolve("Gemm", "l1")
    assert gemm == Override(
        weights=datatype("mx9"),
        activations=None,
        round_mode="zero",
        scale_mode="floor",
        weight_scale_mode="search",
        activation_axis=0,
    )
    assert r.sets_a_format()
    assert load_recipe({"op_type_overrides": {"Conv": {"weights": "mx6"}}}).sets_a_format()
    assert not load_recipe({"op_type_overrides": {"Conv": {"weights": None}}}).sets_a_format()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        # (recipe keys, {node: (activation scale mode, weight scale mode)})
        ({}, {"m": ("floor", "search"), "c": ("floor", "search")}),
        ({"scale_mode": "floor"}, {"m": ("floor", "floor"), "c": ("floor", "floor")}),
        ({"scale_mode": "ceil"}, {"m": ("ceil", "ceil"), "c": ("ceil", "ceil")}),
        # search names no run-time rule: activations keep floor
        ({"scale_mode": "search"}, {"m": ("floor", "search"), "c": ("floor", "search")}),
        ({"weight_scale_mode": "rceil"}, {"m": ("floor", "rceil"), "c": ("floor", "rceil")}),
        (
            {"scale_mode": "ceil", "weight_scale_mode": "search"},
            {"m": ("ceil", "search"), "c": ("ceil", "search")},
        ),
        # a later layer's scale_mode replaces an earlier weight_scale_mode
        (
            {"weight_scale_mode": "rceil", "op_type_overrides": {"Conv": {"scale_mode": "ceil"}}},
            {"m": ("floor", "rceil"), "c": ("ceil", "ceil")},
        ),
        (
            {"scale_mode": "midmax", "node_overrides": {"c": {"weight_scale_mode": "floor"}}},
            {"m": ("midmax", "midmax"), "c": ("midmax", "floor")},
        ),
    ],
)
def test_scale_mode_layers(data: dict, expected: dict) -> None:
    r = load_recipe({"weights": "mxfp4", "activations": "mxfp8e4", **data})
    types = {"m": "MatMul", "c": "Conv"}
    for node, (act, weight) in expected.items():
        choice = r.resolve(types[node], node)
        assert (choice.scale_mode, choice.weight_scale_mode) == (act, weight), node
    assert load_recipe(r.to_dict()) == r  # the new key survives the round trip


def test_check_nodes() -> None:
    r = load_recipe({"weights": "mxfp4", "exclude": ["a*"], "node_overrides": {"b": {}}})
    r.check_nodes(["a1", "b", ""])
    with pytest.raises(ValueError, match="exclude pattern 'a\\*' matches no node"):
        r.check_nodes(["b"])
    with pytest.raises(ValueError, match="node_overrides: node 'b' does not exist"):
        r.check_nodes(["a1"])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"weigths": "mxfp4"}, "recipe: unknown key 'weigths'"),
        ({"weights": "mxfp5"}, "recipe.weights: unknown format 'mxfp5'"),
        ({"weights": 4}, "recipe.weights: expected a format name or code"),
        ({"round_mode": "up"}, "recipe.round_mode: unknown round_mode 'up'"),
        ({"op_types": "MatMul"}, "recipe.op_types: expected a list of op types"),
        ({"op_types": [1]}, "recipe.op_types: expected a list of op type names"),
        (
            {"add_op_types": ["Softmax"]},
            "op type 'Softmax' is not supported; expected one of "
            "MatMul, Gemm, Conv, ConvTranspose, LSTM, GRU, RNN, Gather",
        ),
        ({"exclude": "head"}, "recipe.exclude: expected a list of node-name patterns"),
        ({"exclude": [1]}, "recipe.exclude: expected node-name patterns"),
        ({"custom_ops_only": "yes"}, "recipe.custom_ops_only: expected true or false"),
        ({"op_type_overrides": {"Softmax": {}}}, "op_type_overrides: op type 'Softmax'"),
        ({"node_overrides": ["a"]}, "recipe.node_overrides: expected a mapping"),
        ({"node_overrides": {"a": 1}}, "node_overrides\\['a'\\]: expected a mapping"),
        ({"node_overrides": {"a": {"round": "even"}}}, "unknown key 'round'"),
        ({"node_overrides": {"a": {"weight_axis": True}}}, "expected an integer axis"),
    ],
)
def test_bad_mappings_name_the_key(data: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_recipe(data)


def test_bad_files(tmp_path: Path) -> None:
    cases = {
        "missing.yaml": (None, "does not exist or is not a file"),
        "empty.yaml": (b"", "is empty"),
        "list.yaml": (b"- weights\n", "holds a list, not a mapping"),
        "bad.json": (b"{weights", "is not valid YAML/JSON"),
        "binary.yaml": (b"\xff\xfe", "is not text \\(byte 0xff at offset 0"),
        "nul.yaml": (b"weights: mxfp4\0", "holds NUL bytes"),
        "key.yaml": (b"wieghts: mxfp4\n", "recipe key.yaml: unknown key 'wieghts'"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_bytes(content)
        with pytest.raises(ValueError, match=message):
            load_recipe(path)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * ((1 << 20) + 1))
    with pytest.raises(ValueError, match="over the 1,048,576 a recipe may have"):
        load_recipe(big)
    with pytest.raises(TypeError, match="recipe must be a path, a mapping or a Recipe, not int"):
        load_recipe(3)  # type: ignore[arg-type]
