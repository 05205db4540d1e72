"""``--activations mxfp8`` on real models: every target-op activation quantized, and it runs.

The models ship in pip packages (`tests.models.real`) or are exported from PyTorch with
dynamic axes into a temporary folder (`tests.models.exports`); each test skips cleanly when
its package is missing. The share of target-op float inputs quantized is read off the
quantized model (`tests.graph.activation_share`) and must be 100%; the quantized model runs in
onnxruntime with the onnxq custom-op library and without it (the function fallbacks), and
its output's cosine to the float model's is printed (``pytest -s``) and bounded.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxq.graph.ort_session import has_custom_ops, session
from onnxq.graph.quantize import quantize_model
from tests.graph.activation_share import activation_share
from tests.models import exports, real

Loader = Callable[[Path], tuple[Path, dict[str, np.ndarray]]]


def _packaged(name: str) -> Loader:
    def load(_folder: Path) -> tuple[Path, dict[str, np.ndarray]]:
        return real.model_path(name), real.example_inputs(name)

    return load


MODELS: dict[str, Loader] = {
    "minilm_l3": _packaged("minilm"),
    "ppocrv6_rec": _packaged("ppocr"),
    "silero_vad": _packaged("silero"),
    "ppocrv4_det": _packaged("ppocrv4_det"),
    "ppocrv4_rec": _packaged("ppocrv4_rec"),
    "ppocrv4_cls": _packaged("ppocrv4_cls"),
    "efficientnet_lite0": exports.efficientnet_lite0,
    "attention_block": exports.attention_block,
    "all_minilm_l6": exports.all_minilm_l6,
}
# Output cosine to float that MXFP8 activations (weights float) must keep.
MIN_COSINE = 0.95


_EXPORTED: dict[str, tuple[Path, dict[str, np.ndarray]]] = {}


def _load(name: str, factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """The model's path and inputs; an export is made once per test session."""
    if name not in _EXPORTED:
        try:
            _EXPORTED[name] = MODELS[name](factory.mktemp(name))
        except real.MissingModelError as err:
            pytest.skip(str(err))
    return _EXPORTED[name]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / denom) if denom else float(np.array_equal(a, b))


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "pair"])
@pytest.mark.parametrize("name", list(MODELS))
def test_every_activation_is_quantized_and_runs(
    name: str, fuse: bool, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path, feeds = _load(name, tmp_path_factory)
    out = tmp_path / "q.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_model(str(path), str(out), activations="mxfp8", fuse=fuse)
    q = onnx.load(str(out))
    done, total, missed = activation_share(q)
    print(f"\n{name} ({'fused' if fuse else 'pair'}): {done}/{total} activations quantized")
    assert total > 0 and done == total, missed
    reference = ort.InferenceSession(str(path)).run(None, feeds)[0]
    plain = ort.InferenceSession(str(out)).run(None, feeds)[0]  # function fallbacks
    cos = _cosine(reference, plain)
    print(f"{name}: output cosine to float {cos:.5f} (plain onnxruntime)")
    assert plain.shape == reference.shape and cos >= MIN_COSINE
    if has_custom_ops():
        custom = session(str(out)).run(None, feeds)[0]
        # The custom ops and the fallbacks compute the same bits (docs/ops.md); the ops
        # after them are float and may differ in summation order.
        assert _cosine(custom, plain) > 0.9999
