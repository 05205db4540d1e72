"""Named deployment recipes (onnxq/recipes/*.yaml): Python API and `onnxq quantize --preset`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import onnxq
from onnxq import cli
from onnxq.deploy.export import quantized_weights
from onnxq.graph.recipe import Recipe, deployment_presets, deployment_recipe, load_recipe
from tests.models import builders

PRESETS = {
    "bfp16-deploy": ("bfp16", "bfp16"),
    "mx6-deploy": ("mx6", "mx9"),
    "mx9-deploy": ("mx9", "mx9"),
    "mxfp8-deploy": ("mxfp8", "mxfp8"),
}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _dq_formats(model: onnx.ModelProto) -> tuple[set[str], set[str]]:
    """Data type codes of packed weights (DequantizeMX or fused) and of activation quantizers."""
    stored = {t.name for t in model.graph.initializer}
    weights, acts = set(), set()
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "DequantizeMX" and node.input[0] in stored:
            weights.add(attrs["dtype"].decode())
        elif node.op_type in ("MatMulMX", "GatherMX") and node.input[1] in stored:  # fused
            weights.add(attrs["dtype"].decode())
        elif node.op_type in ("QuantizeMX", "QuantizeDequantizeMX"):
            acts.add(attrs["dtype"].decode())
    return weights, acts


def test_presets_are_shipped_files() -> None:
    presets = deployment_presets()
    assert set(presets) == set(PRESETS)
    for path in presets.values():
        assert path.is_file() and path.parent.name == "recipes"
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert "recipes/*.yaml" in pyproject


@pytest.mark.parametrize(("name", "formats"), PRESETS.items())
def test_preset_recipe_formats(name: str, formats: tuple[str, str]) -> None:
    recipe = deployment_recipe(name)
    assert isinstance(recipe, Recipe)
    assert recipe.weights == onnxq.datatype(formats[0])
    assert recipe.activations == onnxq.datatype(formats[1])
    assert recipe.op_types == ("MatMul", "Gemm", "Conv")
    assert load_recipe(deployment_presets()[name]) == recipe  # a user's copy loads the same


def test_block_size_rewrites_bfp16() -> None:
    recipe = deployment_recipe("bfp16-deploy", block_size=8)
    assert recipe.weights is not None and recipe.weights.code == "int8_e8m0_t8"
    assert recipe.activations is not None and recipe.activations.code == "int8_e8m0_t8"
    with pytest.raises(ValueError, match="no BFP16"):
        deployment_recipe("mx6-deploy", block_size=8)
    with pytest.raises(ValueError, match="power of two"):
        deployment_recipe("bfp16-deploy", block_size=12)
    with pytest.raises(ValueError, match="unknown deployment preset"):
        deployment_recipe("bfp17-deploy")


@pytest.mark.parametrize(("name", "formats"), PRESETS.items())
def test_preset_quantizes_every_matmul_gemm_conv(name: str, formats: tuple[str, str]) -> None:
    model, _ = builders.mlp()
    q = onnxq.quantize_model(model, recipe=deployment_recipe(name))
    weights, acts = _dq_formats(q)
    assert weights == {onnxq.datatype(formats[0]).code}
    assert acts == {onnxq.datatype(formats[1]).code}
    # every weight's tiles run along the reduction axis (K): MatMul B axis 0, Gemm transB axis 1
    axes = {k: v.axis for k, v in quantized_weights(q).items()}
    assert axes == {"w0": 0, "w1": 0, "head_w": 1}


def test_cnn_conv_weights_tile_input_channels() -> None:
    model, _ = builders.cnn()
    q = onnxq.quantize_model(model, recipe=deployment_recipe("mx6-deploy"))
    axes = {k: v.axis for k, v in quantized_weights(q).items()}
    assert axes == {"conv0_w": 1, "conv1_w": 1}  # ConvTranspose is not a deployment target


def test_cli_preset_with_block_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, _ = builders.mlp()
    src, out = tmp_path / "m.onnx", tmp_path / "m.q.onnx"
    onnx.save(model, str(src))
    argv = ["quantize", str(src), "-o", str(out), "--preset", "bfp16-deploy", "--block-size", "8"]
    code, stdout, err = _run(argv, capsys)
    assert code == 0, err
    assert "preset bfp16-deploy block 8" in stdout
    q = onnx.load(str(out))
    assert _dq_formats(q) == ({"int8_e8m0_t8"}, {"int8_e8m0_t8"})
    recorded = {p.key: p.value for p in q.metadata_props}
    assert json.loads(recorded["onnxq_recipe"])["weights"] == "int8_e8m0_t8"
    same = onnxq.quantize_model(model, recipe=deployment_recipe("bfp16-deploy", 8))
    for (a, qa), (b, qb) in zip(
        quantized_weights(q).items(), quantized_weights(same).items(), strict=True
    ):
        assert a == b and np.array_equal(onnxq.upcast(qa), onnxq.upcast(qb))


def test_list_presets_prints_each_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["quantize", "--list-presets"], capsys)
    assert code == 0
    for name in PRESETS:
        assert f"{name}:" in out
        assert str(deployment_presets()[name]) in out
    assert '"weights": "mx6"' in out and '"activations": "mx9"' in out


@pytest.mark.parametrize(
    ("extra", "word"),
    [
        (["--preset", "nope"], "unknown deployment preset"),
        (["--preset", "mx6-deploy", "--block-size", "8"], "no BFP16"),
        (["--preset", "bfp16-deploy", "--block-size", "6"], "power of two"),
        (["--block-size", "8", "--weights", "bfp16"], "--block-size needs --preset"),
        (["--preset", "mx6-deploy", "--weights", "mxfp4"], "cannot be combined with --weights"),
    ],
)
def test_bad_preset_options_exit_2(
    extra: list[str], word: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, _ = builders.mlp()
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    code, out, err = _run(["quantize", str(src), "-o", str(tmp_path / "o.onnx"), *extra], capsys)
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and word in err
    assert not (tmp_path / "o.onnx").exists()
