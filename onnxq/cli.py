"""The ``onnxq`` command: quantize, run, compare, inspect and export ONNX models, list formats.

``main(argv)`` parses the arguments, runs one subcommand and returns the exit status, so tests
call it in-process; the console script ``onnxq`` and ``python -m onnxq`` wrap it.

Exit status: 0 on success, 2 for bad input (one line on stderr naming the problem and the fix,
never a traceback, nothing written), 1 for an unexpected failure (one line; set
``ONNXQ_DEBUG=1`` for the traceback), 141 (128 + SIGPIPE, quietly) when the reader of stdout
goes away, as in ``onnxq inspect m.onnx | head``. Output files are written to hidden temporary
files beside the target and renamed into place (`onnxq._output`), so a failed command leaves
nothing behind and a killed one only hidden ``*.onnxq-tmp`` files that the next run removes;
input files are never written to (unless ``quantize --overwrite`` names the model as the
output).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import onnx

import onnxq
from onnxq import _output
from onnxq._files import check_external, load_model
from onnxq.graph.walk import stored_tensors, walk_graphs
from onnxq.progress import ProgressBar

__all__ = ["EXIT_FAILURE", "EXIT_USAGE", "UsageError", "build_parser", "main"]

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a filter killed by SIGPIPE

_PROG = "onnxq"
_QUANT_OPS = ("DequantizeMX", "CodebookLookup")
_FLOAT_ELEMS = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.BFLOAT16,
}
# Sub-byte element types that numpy's itemsize would overstate.
_ELEM_BITS = {onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4}
if hasattr(onnx.TensorProto, "FLOAT4E2M1"):
    _ELEM_BITS[onnx.TensorProto.FLOAT4E2M1] = 4
_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int8)": np.int8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
}
_SCORE_NAME = re.compile(r"logit|prob|score|class|softmax", re.IGNORECASE)
_MAX_GENERATED = 1 << 30  # values per generated input (4 GiB of float32)


class UsageError(Exception):
    """Bad input: the command stops with exit status 2 and this one-line message."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        """Record the problem and, when there is one, how to fix it.

        Args:
            problem: what is wrong, naming the path, option or value.
            fix: what the user should do instead.
        """
        text = _one_line(problem)
        super().__init__(f"{text}; {fix}" if fix else text)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (argparse prints the usage too)."""

    def error(self, message: str) -> NoReturn:
        """Raise a UsageError instead of printing the usage and exiting."""
        raise UsageError(f"{self.prog}: {message}", f"see `{self.prog} --help`")

    def _print_message(self, message: str, file: Any = None) -> None:
        # argparse swallows OSError here; a closed stdout must reach main's BrokenPipe handling.
        if message:
            (file or sys.stderr).write(message)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _human(nbytes: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(nbytes) < 1000 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")  # pragma: no cover


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in headers], *[[str(c) for c in row] for row in rows]]
    keep = [i for i in range(len(headers)) if any(row[i] for row in cells)]
    cells = [[row[i] for i in keep] for row in cells]
    headers = cells[0]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths).rstrip())
    return "\n".join(lines)


# -- paths and models ----------------------------------------------------------------------
def _existing_file(path: str, what: str) -> Path:
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{what} {path!r} is a directory, not a file", "give a file inside it")
    if not p.is_file():
        raise UsageError(f"{what} {path!r} does not exist", "check the path")
    return p


def _load_model(path: str) -> tuple[Path, onnx.ModelProto]:
    """Check that ``path`` is a complete ONNX model; load its graph without external data."""
    p = _existing_file(path, "model")
    fix = "give a complete .onnx file (export or copy it again)"
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as err:  # protobuf's DecodeError and friends: not ONNX, or cut short
        raise UsageError(
            f"{path!r} is not an ONNX model or is truncated ({_one_line(err)[:120]})", fix
        ) from None
    if model.ir_version <= 0 or not model.HasField("graph") or not model.opset_import:
        raise UsageError(f"{path!r} is not an ONNX model or is truncated (no graph or opset)", fix)
    try:  # every command refuses external data outside the model's folder before reading
        check_external(model, p.parent)
    except ValueError as err:
        raise UsageError(
            f"model {path!r}: {_one_line(err)}",
            "keep external data files beside the model and name them by relative paths",
        ) from None
    return p, model


def _data_files(path: Path, model: onnx.ModelProto) -> list[tuple[str, str]]:
    """("external data file", path) of each file the model's tensors refer to."""
    names = {e.value for g in walk_graphs(model.graph) for t in g.initializer
             for e in t.external_data if e.key == "location"}  # fmt: skip
    return [("model's external data file", str(path.parent / n)) for n in sorted(names)]


def _file_bytes(path: Path, model: onnx.ModelProto) -> int:
    """Size of the model file plus the external data files it references."""
    total = path.stat().st_size
    seen: set[str] = set()
    for graph in walk_graphs(model.graph):
        for tensor in graph.initializer:
            for entry in tensor.external_data:
                if entry.key == "location" and entry.value not in seen:
                    seen.add(entry.value)
                    data = path.parent / entry.value
                    total += data.stat().st_size if data.is_file() else 0
    return total


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    """Bytes a tensor's data takes, from its dims and type (no data is read)."""
    if tensor.data_type == onnx.TensorProto.STRING:
        return sum(len(s) for s in tensor.string_data)
    bits = _ELEM_BITS.get(tensor.data_type)
    if bits is None:
        try:
            bits = 8 * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        except (KeyError, ValueError, TypeError):  # an unknown element type: what is stored
            return len(tensor.raw_data)
    return math.ceil(math.prod(tensor.dims) * bits / 8)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return b.exists() and os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def _output_path(path: str, option: str) -> Path:
    """Check that an output file can be made at ``path`` (its folder exists)."""
    out = Path(path)
    if out.is_dir():
        raise UsageError(f"{option} {path!r} is a directory", "give a file name inside it")
    folder = out.parent
    if not folder.is_dir():
        raise UsageError(
            f"the output folder {str(folder)!r} of {option} does not exist or is not a folder",
            "create it first or choose another path",
        )
    return out


def _not_an_input(out: Path, option: str, inputs: Sequence[tuple[str, str | None]]) -> None:
    """Refuse an output path that names one of the command's input files."""
    for what, path in inputs:
        if path and _same_file(Path(path), out):
            raise UsageError(
                f"{option} {str(out)!r} is the {what}, which onnxq never overwrites",
                "write the output to another path",
            )


def _format_arg(value: str | None, option: str) -> str | None:
    if value is None:
        return None
    try:
        onnxq.datatype(value)
    except (ValueError, TypeError) as err:
        raise UsageError(
            f"unknown format {value!r} for {option} ({_one_line(err)})",
            "run `onnxq formats` for the presets, or give a data type code such as "
            "e2m1fnuz_e8m0_t32",
        ) from None
    return value


# -- onnxruntime -----------------------------------------------------------------------------
def _session(model: Path | onnx.ModelProto, label: str) -> Any:
    """An onnxruntime session, with the onnxq custom ops when the library is built.

    Without the library a plain session still runs what onnxq writes (function fallbacks).
    """
    import onnxruntime as ort

    from onnxq import runtime

    options = ort.SessionOptions()
    options.log_severity_level = 4  # the command reports errors itself, in one line
    try:
        if runtime.has_custom_ops():
            source: Any = str(model) if isinstance(model, Path) else model
            return runtime.session(source, sess_options=options)
        source = str(model) if isinstance(model, Path) else model.SerializeToString()
        return ort.InferenceSession(
            source, sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as err:  # onnxruntime raises its own exception types
        raise UsageError(
            f"onnxruntime cannot load {label}: {_one_line(err)[:300]}",
            "check the model with onnx.checker; models with onnxq ops need the custom-op "
            "library (pip install -e .) or embedded function fallbacks",
        ) from None


def _count(option: str, low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high], refused in one line otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option} {text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{option} {value} is not in [{low}, {high}]")
        return value

    return parse


def _parse_dims(items: Sequence[str] | None) -> dict[str, int]:
    dims: dict[str, int] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name or not value.isascii() or not value.isdigit() or int(value) < 1:
            raise UsageError(f"--dim {item!r} is not NAME=SIZE", "write e.g. --dim seq=128")
        dims[name] = int(value)
    return dims


def _generated(arg: Any, rng: np.random.Generator, batch: int, dims: Mapping[str, int]) -> Any:
    dtype = _ORT_TYPES.get(arg.type)
    if dtype is None:
        raise UsageError(
            f"cannot generate input {arg.name!r} of type {arg.type}", "pass it with --inputs"
        )
    shape = []
    for i, d in enumerate(arg.shape):
        if isinstance(d, int) and d >= 0:
            shape.append(d)
        elif isinstance(d, str) and d in dims:
            shape.append(dims[d])
        else:
            shape.append(batch if i == 0 else 1)
    if math.prod(shape) > _MAX_GENERATED:
        raise UsageError(
            f"generated input {arg.name!r} of shape {shape} has over {_MAX_GENERATED:,} values",
            "pass a smaller --batch or --dim, or the arrays with --inputs",
        )
    try:
        if np.issubdtype(dtype, np.floating):
            return rng.standard_normal(shape).astype(dtype)
        if dtype is np.bool_:
            return np.ones(shape, np.bool_)
        if "mask" in arg.name.lower():  # attention masks: attend everywhere
            return np.ones(shape, dtype)
        return rng.integers(1, 10, shape).astype(dtype)  # no zeros: divisors, valid indices
    except MemoryError:
        raise UsageError(
            f"generated input {arg.name!r} of shape {shape} does not fit in memory",
            "pass a smaller --batch or --dim",
        ) from None


def _feeds(
    inputs: Sequence[Any], npz: str | None, batch: int, dims: Mapping[str, int], seed: int
) -> dict[str, np.ndarray]:
    """Inputs for a session: arrays from ``npz``, or generated from each input's type and shape.

    Generated inputs are seeded, so ``run`` and ``compare`` make the same ones.
    """
    if npz is None:
        rng = np.random.default_rng(seed)
        return {arg.name: _generated(arg, rng, batch, dims) for arg in inputs}
    path = _existing_file(npz, "--inputs")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as err:
        raise UsageError(
            f"--inputs {npz!r} is not a readable .npz file ({_one_line(err)[:120]})",
            "write one with numpy.savez(path, input_name=array, ...)",
        ) from None
    names = [arg.name for arg in inputs]
    missing = [n for n in names if n not in arrays]
    extra = [k for k in arrays if k not in names]
    if missing or extra:
        raise UsageError(
            f"--inputs {npz!r} has arrays {sorted(arrays)} but the model takes {names}",
            "name each array after a model input",
        )
    feeds = {}
    for arg in inputs:
        want = _ORT_TYPES.get(arg.type)
        got = arrays[arg.name]
        if want is not None and got.dtype != want:
            if not np.can_cast(got.dtype, want, "same_kind"):
                raise UsageError(
                    f"--inputs array {arg.name!r} is {got.dtype}, the model wants {arg.type}",
                    f"save it as {np.dtype(want)}",
                )
            got = got.astype(want)
        feeds[arg.name] = got
    return feeds


def _run_session(sess: Any, feeds: Mapping[str, np.ndarray], names: list[str], label: str) -> list:
    try:
        return list(sess.run(names, dict(feeds)))
    except Exception as err:
        raise UsageError(
            f"running {label} failed: {_one_line(err)[:300]}",
            "check the input shapes and types (--inputs, --batch, --dim)",
        ) from None


def _save_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    try:
        _output.sweep(path.parent)
        with _output.new_file(path) as (f, temp):
            np.savez(f, **arrays)  # to a file object: np.savez on a path would append ".npz"
            f.flush()
            _output.replace(temp, path)
    except OSError as err:
        raise UsageError(
            f"cannot write {str(path)!r} ({err.strerror or err})",
            "choose a writable folder with free space",
        ) from None


# -- subcommands -----------------------------------------------------------------------------
def _quantizer() -> Callable[..., onnx.ModelProto]:
    fn = getattr(onnxq, "quantize_model", None)
    if fn is None:
        try:
            from onnxq.graph.quantize import quantize_model as fn
        except ImportError as err:
            raise RuntimeError(f"this onnxq has no graph quantizer ({err})") from None
    return fn


def _list_presets() -> int:
    from onnxq.graph.recipe import deployment_presets, deployment_recipe

    blocks = []
    for name, path in deployment_presets().items():
        comment = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.startswith("#"):
                break
            comment.append(line.lstrip("# ").rstrip())
        summary = " ".join(comment).split(". ")[0].removeprefix(f"{name}: ")
        body = json.dumps(deployment_recipe(name).to_dict(), sort_keys=True)
        blocks.append(f"{name}: {summary}\n  file: {path}\n  recipe: {body}")
    print("\n".join(blocks))
    print(
        "\nUse one with `onnxq quantize MODEL -o OUT --preset NAME` (`--block-size N` resizes "
        "BFP16 blocks), or copy its file, edit it and pass it with --recipe."
    )
    return 0


def _preset_recipe(args: argparse.Namespace) -> Any:
    """The Recipe of ``--preset`` (with ``--block-size``), or None without ``--preset``."""
    if args.preset is None:
        if args.block_size is not None:
            raise UsageError("--block-size needs --preset", "e.g. --preset bfp16-deploy")
        return None
    clash = [o for o, v in (("--weights", args.weights), ("--activations", args.activations),
                            ("--recipe", args.recipe)) if v]  # fmt: skip
    if clash:
        raise UsageError(
            f"--preset cannot be combined with {clash[0]}",
            "copy the preset's file (`onnxq quantize --list-presets`), edit it and pass "
            "it with --recipe",
        )
    from onnxq.graph.recipe import deployment_recipe

    try:
        return deployment_recipe(args.preset, args.block_size)
    except ValueError as err:
        raise UsageError(str(err), "run `onnxq quantize --list-presets`") from None


def _cmd_quantize(args: argparse.Namespace) -> int:
    if args.list_presets:
        return _list_presets()
    if args.model is None:
        raise UsageError(
            "quantize: the following arguments are required: MODEL", "see `onnxq quantize --help`"
        )
    if args.output is None:
        raise UsageError(
            "quantize: the following arguments are required: -o/--output",
            "see `onnxq quantize --help`",
        )
    src, model = _load_model(args.model)
    out = _output_path(args.output, "-o/--output")
    if _same_file(src, out) and not args.overwrite:
        raise UsageError(
            f"the output {args.output!r} is the input model",
            "write to another path with -o, or pass --overwrite to replace the input",
        )
    _not_an_input(out, "-o/--output", [("--recipe file", args.recipe), *_data_files(src, model)])
    weights = _format_arg(args.weights, "--weights")
    activations = _format_arg(args.activations, "--activations")
    recipe: Any = str(_existing_file(args.recipe, "--recipe")) if args.recipe else None
    preset = _preset_recipe(args)
    if preset is not None:
        recipe = preset
    if weights is None and activations is None and recipe is None:
        raise UsageError(
            "nothing to quantize", "pass --weights FMT, --activations FMT, --recipe or --preset"
        )
    calibration = None
    if args.calibration:
        if not Path(args.calibration).is_dir():
            raise UsageError(
                f"--calibration {args.calibration!r} is not a folder",
                "give a folder of .npz input files",
            )
        calibration = args.calibration
    quantize = _quantizer()
    before = _file_bytes(src, model)
    start = time.monotonic()
    bar = ProgressBar()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:  # writes beside `out` and renames, removing what it left if it fails
                result = quantize(
                    str(src),
                    str(out),
                    weights=weights,
                    activations=activations,
                    recipe=recipe,
                    weight_storage=args.storage,
                    target=args.target,
                    calibration=calibration,
                    calibration_method=args.calibration_method,
                    percentile=args.percentile,
                    progress=bar,
                    overwrite=args.overwrite,
                    custom_ops_only=args.custom_ops_only,
                    allow_empty=args.allow_empty,
                )
            except (ValueError, TypeError, FileNotFoundError, NotImplementedError) as err:
                raise UsageError(str(err)) from None
            finally:
                bar.close()
    except OSError as err:
        raise UsageError(
            f"cannot write {args.output!r} ({err.strerror or err})",
            "choose a writable folder with free space",
        ) from None
    for warning in caught:  # one line each, after the work, instead of Python's two
        print(f"{_PROG}: warning: {_one_line(warning.message)}", file=sys.stderr)
    after = _file_bytes(out, onnx.load(str(out), load_external_data=False))
    label = None if args.preset else args.recipe
    block = f" block {args.block_size}" if args.block_size else ""
    formats = ", ".join(
        f"{what} {fmt}"
        for what, fmt in (
            ("weights", weights),
            ("activations", activations),
            ("recipe", label),
            ("preset", f"{args.preset}{block}" if args.preset else None),
        )
        if fmt
    )
    print(
        f"{src.name} -> {out}: {_human(before)} -> {_human(after)} ({after / before:.1%}); "
        f"{formats}{_counts(result)}; {args.storage} storage, {args.target} target; "
        f"{time.monotonic() - start:.1f} s"
    )
    return 0


def _counts(model: onnx.ModelProto) -> str:
    """``"; N weights, M activations quantized, K skipped ..."`` from the quantizer's metadata."""
    meta = {p.key: p.value for p in model.metadata_props}
    parts = []
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        counts = json.loads(meta.get("onnxq_quantized", "{}"))
        if counts:
            parts.append(", ".join(f"{int(v)} {k}" for k, v in counts.items()) + " quantized")
    with contextlib.suppress(ValueError, TypeError):
        skipped = len(json.loads(meta.get("onnxq_skipped", "[]")))
        if skipped:
            parts.append(f"{skipped} skipped (onnxq inspect says why)")
    if "onnxq_custom_ops_only" in meta:
        parts.append("custom-op-only model: it runs only with the onnxq custom-op library")
    return "".join(f"; {p}" for p in parts)


def _summaries(names: Sequence[str], arrays: Sequence[np.ndarray]) -> str:
    rows = []
    for name, a in zip(names, arrays, strict=True):
        a = np.asarray(a)
        if a.size and (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_):
            v = a.astype(np.float64)
            finite = v[np.isfinite(v)]
            bad = v.size - finite.size
            stats = (
                [f"{finite.min():.6g}", f"{finite.max():.6g}", f"{finite.mean():.6g}"]
                if finite.size
                else ["-", "-", "-"]
            )
            note = f"{bad} non-finite" if bad else ""
        else:
            stats, note = ["-", "-", "-"], ""
        rows.append([name, "x".join(map(str, a.shape)) or "scalar", a.dtype, *stats, note])
    return _table(["output", "shape", "dtype", "min", "max", "mean", ""], rows)


def _cmd_run(args: argparse.Namespace) -> int:
    src, model = _load_model(args.model)
    save = _output_path(args.save, "--save") if args.save else None
    if save is not None:
        _not_an_input(save, "--save", [("model", args.model), ("--inputs file", args.inputs),
                                       *_data_files(src, model)])  # fmt: skip
    sess = _session(src, repr(args.model))
    feeds = _feeds(sess.get_inputs(), args.inputs, args.batch, _parse_dims(args.dim), args.seed)
    names = [o.name for o in sess.get_outputs()]
    outputs = _run_session(sess, feeds, names, repr(args.model))
    if save is not None:
        _save_npz(save, dict(zip(names, outputs, strict=True)))
    print(_summaries(names, outputs))
    if save is not None:
        print(f"saved {len(names)} outputs to {save}")
    return 0


def _metrics(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """Cosine similarity, SQNR (dB) and max abs error of ``got`` against ``ref``."""
    a = np.asarray(ref, np.float64).ravel()
    b = np.asarray(got, np.float64).ravel()
    signal = float(np.dot(a, a))
    noise = float(np.sum((a - b) ** 2))
    norms = math.sqrt(signal * float(np.dot(b, b)))
    if norms:
        cos = float(np.dot(a, b)) / norms
    else:
        cos = 1.0 if signal == noise == 0 else 0.0
    if noise == 0:
        sqnr = math.inf
    elif signal == 0:
        sqnr = -math.inf
    else:
        sqnr = 10 * math.log10(signal / noise)
    err = float(np.max(np.abs(a - b))) if a.size else 0.0
    return {"cos": cos, "sqnr": sqnr, "max_abs": err}


def _looks_like_scores(name: str, a: np.ndarray, producer: str | None) -> bool:
    """True for logits or probabilities.

    That is: float, rank >= 2 with a class axis last, and a Softmax producer, a name that
    says so, or rows that are probability distributions.
    """
    if a.ndim < 2 or a.shape[-1] < 2 or not np.issubdtype(a.dtype, np.floating) or not a.size:
        return False
    if producer in ("Softmax", "LogSoftmax") or _SCORE_NAME.search(name):
        return True
    v = a.astype(np.float64)
    return bool(np.all(v >= 0) and np.allclose(v.sum(-1), 1.0, atol=1e-3))


def _producers(graph: onnx.GraphProto) -> dict[str, str]:
    """Op type that makes each tensor, seen through Identity nodes."""
    made = {out: node for node in graph.node for out in node.output if out}
    result = {}
    for name, node in made.items():
        while node.op_type == "Identity" and node.input and node.input[0] in made:
            node = made[node.input[0]]
        result[name] = node.op_type
    return result


def _fmt(value: float, spec: str) -> str:
    return "inf" if value == math.inf else "-inf" if value == -math.inf else format(value, spec)


def _layer_candidates(f_model: onnx.ModelProto, q_model: onnx.ModelProto) -> list[str]:
    """Float tensors made by nodes of both main graphs, in the float graph's order."""
    outputs = {o.name for o in f_model.graph.output}
    q_made = {o for node in q_model.graph.node for o in node.output if o}
    constants = {
        o for node in f_model.graph.node if node.op_type == "Constant" for o in node.output
    }
    outputs |= constants
    names = [
        o
        for node in f_model.graph.node
        for o in node.output
        if o and o in q_made and o not in outputs
    ]
    return list(dict.fromkeys(names))


def _expose(model: onnx.ModelProto, names: Sequence[str]) -> list[str]:
    """Make the float tensors among ``names`` graph outputs of ``model`` (in place).

    Only tensors whose type shape inference knows are added; returns their names.
    """
    from onnxq.graph.schemas import infer_shapes  # types onnxq outputs on every onnx release

    try:
        inferred = infer_shapes(model)
    except Exception:
        return []
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    added = [n for n in names if types.get(n) in _FLOAT_ELEMS]
    for n in added:
        model.graph.output.append(onnx.helper.make_tensor_value_info(n, types[n], None))
    return added


def _cmd_compare(args: argparse.Namespace) -> int:
    f_src, f_model = _load_model(args.float_model)
    q_src, _ = _load_model(args.quant_model)
    layers: list[str] = []
    f_target: Path | onnx.ModelProto = f_src
    q_target: Path | onnx.ModelProto = q_src
    if args.layers:
        f_full = load_model(f_src)
        q_full = load_model(q_src)
        wanted = _layer_candidates(f_full, q_full)
        in_quant = set(_expose(q_full, wanted))
        layers = [n for n in _expose(f_full, wanted) if n in in_quant]
        f_target, q_target = f_full, q_full
    f_sess = _session(f_target, repr(args.float_model))
    q_sess = _session(q_target, repr(args.quant_model))
    f_in = {a.name: a.type for a in f_sess.get_inputs()}
    q_in = {a.name: a.type for a in q_sess.get_inputs()}
    if f_in != q_in:
        raise UsageError(
            f"the models take different inputs ({f_in} vs {q_in})",
            "compare a quantized model with the float model it was made from",
        )
    f_out = [o.name for o in f_sess.get_outputs() if o.name not in layers]
    q_out = [o.name for o in q_sess.get_outputs() if o.name not in layers]
    pairs = [(n, n) for n in f_out if n in q_out]
    if not pairs and len(f_out) == len(q_out):
        pairs = list(zip(f_out, q_out, strict=True))  # renamed outputs: pair by position
    if not pairs:
        raise UsageError(
            f"the models share no output (float {f_out}, quantized {q_out})",
            "compare a quantized model with the float model it was made from",
        )
    feeds = _feeds(f_sess.get_inputs(), args.inputs, args.batch, _parse_dims(args.dim), args.seed)
    f_names = [f for f, _ in pairs] + layers
    q_names = [q for _, q in pairs] + layers
    f_vals = dict(
        zip(f_names, _run_session(f_sess, feeds, f_names, "the float model"), strict=True)
    )
    q_vals = dict(
        zip(q_names, _run_session(q_sess, feeds, q_names, "the quantized model"), strict=True)
    )
    producers = _producers(f_model.graph)
    rows = []
    for f_name, q_name in pairs:
        a, b = np.asarray(f_vals[f_name]), np.asarray(q_vals[q_name])
        if a.shape != b.shape:
            rows.append([f_name, f"{a.shape} vs {b.shape}", "-", "-", "-", "-"])
            continue
        m = _metrics(a, b)
        top1 = "-"
        if _looks_like_scores(f_name, a, producers.get(f_name)):
            top1 = f"{np.mean(np.argmax(a, -1) == np.argmax(b, -1)):.2%}"
        shape = "x".join(map(str, a.shape)) or "scalar"
        rows.append(
            [f_name, shape, f"{m['cos']:.6f}", _fmt(m["sqnr"], ".2f"), f"{m['max_abs']:.4g}", top1]
        )
    report = [_table(["output", "shape", "cosine", "SQNR dB", "max abs err", "top-1"], rows)]
    if args.layers:
        layer_rows = []
        for name in layers:
            a, b = np.asarray(f_vals[name]), np.asarray(q_vals[name])
            if a.shape != b.shape:
                continue
            m = _metrics(a, b)
            layer_rows.append(
                [
                    name,
                    producers.get(name, "?"),
                    "x".join(map(str, a.shape)) or "scalar",
                    _fmt(m["sqnr"], ".2f"),
                    f"{m['cos']:.6f}",
                    f"{m['max_abs']:.4g}",
                ]
            )
        report.append("")
        report.append(
            _table(["tensor", "op", "shape", "SQNR dB", "cosine", "max abs err"], layer_rows)
            if layer_rows
            else "no intermediate tensor is shared by both graphs"
        )
    print("\n".join(report))
    return 0


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    values = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    # errors="replace": a model's bytes need not be UTF-8; the format parser refuses U+FFFD
    return {k: v.decode(errors="replace") if isinstance(v, bytes) else v for k, v in values.items()}


def _format_name(text: str) -> str:
    """A format as users name it: the preset for a code that has one (shortest alias)."""
    try:
        code = onnxq.datatype(text).code
    except (ValueError, TypeError):
        return text
    names = sorted((len(n), n) for n, dt in onnxq.datatypes().items() if dt.code == code)
    return names[0][1] if names else text


def _cmd_inspect(args: argparse.Namespace) -> int:
    src, model = _load_model(args.model)
    stored = stored_tensors(model)
    total_after = sum(_tensor_bytes(t) for t in stored.values())
    packed: set[str] = set()
    rows = []
    float_bytes = 0
    for graph in walk_graphs(model.graph):
        for node in graph.node:
            row = _quantized_row(node, stored)
            if row is None:
                continue
            inputs, numel, out_bits, cells = row
            if inputs:
                packed.update(inputs)
                float_bytes += numel * out_bits // 8
            rows.append(cells)
    before = float_bytes + sum(_tensor_bytes(t) for n, t in stored.items() if n not in packed)
    lines = [
        f"{src}: {len(model.graph.node)} nodes, {len(stored)} stored tensors, "
        f"file {_human(_file_bytes(src, model))}"
    ]
    meta = {p.key: p.value for p in model.metadata_props if p.key.lower().startswith("onnxq")}
    lines += [f"  {k}: {_one_line(v)[:200]}" for k, v in sorted(meta.items())]
    if rows:
        lines += ["", _table(["tensor", "kind", "format", "shape", "bits/value", "bytes"], rows)]
    else:
        lines += [
            "no quantized tensors (no DequantizeMX, CodebookLookup or blocked "
            "DequantizeLinear; fake-quantized weights are stored as float)"
        ]
    lines += [
        "",
        f"weights: {_human(before)} as float -> {_human(total_after)} stored "
        f"({total_after / before:.1%})"
        if before
        else "weights: none",
    ]
    print("\n".join(lines))
    return 0


def _quantized_row(
    node: onnx.NodeProto, stored: Mapping[str, onnx.TensorProto]
) -> tuple[list[str], int, int, list[object]] | None:
    """Describe a node that decodes a quantized tensor; None for other nodes.

    Returns its stored inputs, element count, output bits and the table row.
    """
    attrs = _attrs(node)
    if node.domain == "onnxq" and node.op_type in _QUANT_OPS:
        shape = [int(d) for d in attrs.get("shape", [])]
        if "dtype" not in attrs:
            raise UsageError(
                f"node {node.name or node.op_type!r} ({node.op_type}) has no dtype attribute: "
                "the model is malformed; quantize the float model again"
            )
        try:  # the attribute is untrusted: a code the ops would refuse is an error, not a label
            fmt = _format_name(onnxq.datatype(str(attrs["dtype"])).name)
        except ValueError as err:
            raise UsageError(f"node {node.name or node.op_type!r}: bad dtype: {err}") from None
        out_type = int(attrs.get("output_type", onnx.TensorProto.FLOAT))
    elif node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx"):
        if not node.input or node.input[0] not in stored:
            return None
        x = stored[node.input[0]]
        shape = list(x.dims)
        elem = onnx.TensorProto.DataType.Name(x.data_type).lower()
        block = attrs.get("block_size", 0)
        fmt = f"{elem} block {block}" if block else f"{elem} axis {attrs.get('axis', 1)}"
        if len(node.input) > 1 and node.input[1] in stored:
            out_type = stored[node.input[1]].data_type
            if not stored[node.input[1]].dims:
                fmt = f"{elem} tensor"
        else:
            out_type = onnx.TensorProto.FLOAT
    else:
        return None
    numel = math.prod(shape)
    try:
        out_bits = 8 * onnx.helper.tensor_dtype_to_np_dtype(out_type).itemsize
    except (KeyError, ValueError, TypeError):  # not a float type: the node is broken
        out_bits = 32
    if not node.output:
        return None
    inputs = [i for i in node.input if i and i in stored]
    shape_text = "x".join(map(str, shape)) or "scalar"
    if node.input and node.input[0] in stored:
        nbytes = sum(_tensor_bytes(stored[i]) for i in inputs)
        bits = f"{8 * nbytes / numel:.3f}" if numel else "-"
        return inputs, numel, out_bits, [node.output[0], "weight", fmt, shape_text, bits, nbytes]
    try:
        bits = f"{onnxq.datatype(fmt).bits_per_value:g}"
    except ValueError:
        bits = "?"
    return [], numel, out_bits, [node.output[0], "activation", fmt, shape_text, bits, "-"]


def _cmd_export(args: argparse.Namespace) -> int:
    from onnxq.deploy import export as exporter

    src, _ = _load_model(args.model)
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o/--output {args.output!r} is a file", "give a folder")
    if not out.parent.is_dir():
        raise UsageError(
            f"the parent folder {str(out.parent)!r} of -o/--output does not exist",
            "create it first or choose another path",
        )
    try:
        manifest = exporter.export(str(src), out, overwrite=args.overwrite)
    except exporter.ExportError as err:
        raise UsageError(str(err)) from None
    except (ValueError, KeyError, TypeError) as err:  # a malformed onnxq node in the model
        raise UsageError(
            f"{args.model!r} has a malformed onnxq node ({type(err).__name__}: "
            f"{_one_line(err)[:200]})",
            "export a model written by `onnxq quantize`",
        ) from None
    except OSError as err:
        raise UsageError(
            f"cannot write {args.output!r} ({err.strerror or err})",
            "choose a writable folder with free space",
        ) from None
    tensors = manifest["tensors"]
    layouts = sorted({t["layout"] for t in tensors})
    total = sum(b["length"] for t in tensors for b in t["blobs"].values())
    print(
        f"{src.name} -> {out}: {len(tensors)} weights, {_human(total)} in "
        f"{manifest['data_file']} ({', '.join(layouts)}); manifest.json"
    )
    return 0


def _cmd_formats(args: argparse.Namespace) -> int:
    rows = [[name, dt.code, f"{dt.bits_per_value:g}"] for name, dt in onnxq.datatypes().items()]
    print(_table(["preset", "code", "bits/value"], rows))
    print(
        "\nAny data type code works too, e.g. e2m1fnuz_e8m0_t32 or cb41fi_e2m2fnuz_e8m0_t32 "
        "(README: The format language)."
    )
    return 0


# -- parser ----------------------------------------------------------------------------------
def _version() -> str:
    parts = []
    for dist in ("onnx", "onnxruntime"):
        try:
            parts.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{dist} missing")
    return f"{_PROG} {onnxq.__version__} ({', '.join(parts)})"


def _add_input_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--inputs",
        metavar="FILE.npz",
        help="input arrays, one per model input, named after it (numpy.savez); "
        "default: random inputs from each input's type and shape",
    )
    p.add_argument(
        "--batch",
        type=_count("--batch", 1, 1 << 20),
        default=1,
        metavar="N",
        help="size of a symbolic first dimension of generated inputs (default 1)",
    )
    p.add_argument(
        "--dim",
        action="append",
        metavar="NAME=SIZE",
        help="size of the symbolic dimension NAME of generated inputs (repeatable); "
        "other symbolic dimensions are 1",
    )
    p.add_argument(
        "--seed",
        type=_count("--seed", 0, 2**63 - 1),
        default=0,
        help="seed of generated inputs (default 0): floats are standard normal, "
        "integers uniform in [1, 10) (ones for inputs named *mask*), booleans true",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``onnxq`` command (every option documented in ``--help``)."""
    parser = _Parser(
        prog=_PROG,
        description="Quantize ONNX models to block-scaled formats (MX, BFP, NVFP4, codebooks), "
        "run them in onnxruntime and compare them with the float model.",
        epilog="Exit status: 0 success, 2 bad input (one line on stderr), 1 failure, 141 "
        "when stdout is closed early (as by `| head`).",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=_version(),
        help="print the onnxq, onnx and onnxruntime versions and exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    q = sub.add_parser(
        "quantize",
        help="quantize a model's weights and/or activations",
        description="Quantize MODEL and write the result to OUT. The input model "
        "is never modified.",
    )
    q.add_argument("model", nargs="?", metavar="MODEL", help="the float .onnx model")
    q.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="where to write the quantized model (written to a temporary file and "
        "renamed, so a failure leaves nothing)",
    )
    q.add_argument(
        "--weights",
        metavar="FMT",
        help="format of the weights of MatMul, Gemm, Conv, ConvTranspose, LSTM, GRU "
        "and embedding Gather nodes: a preset (`onnxq formats`) or a code",
    )
    q.add_argument(
        "--activations",
        metavar="FMT",
        help="format of the activations entering those nodes (default: not quantized)",
    )
    q.add_argument(
        "--recipe",
        metavar="FILE",
        help="YAML or JSON recipe: formats per op type and node-name pattern, "
        "excluded nodes, round/scale modes (overrides --weights/--activations "
        "where it says so)",
    )
    q.add_argument(
        "--storage",
        choices=("packed", "fake"),
        default="packed",
        help="packed: weights stored as packed codes + scales with a DequantizeMX "
        "node (the file shrinks); fake: weights replaced by their dequantized "
        "float values (default packed)",
    )
    q.add_argument(
        "--target",
        choices=("onnxq", "standard"),
        default="onnxq",
        help="onnxq: onnxq custom ops (with standard-ONNX fallbacks embedded); "
        "standard: only standard ONNX ops (default onnxq)",
    )
    q.add_argument(
        "--calibration",
        metavar="DIR",
        help="folder of .npz input files to calibrate activation formats with "
        "tensor or channel float scales",
    )
    q.add_argument(
        "--calibration-method",
        choices=("minmax", "percentile"),
        default="minmax",
        help="how calibration picks each activation's range (default minmax)",
    )
    q.add_argument(
        "--percentile",
        type=float,
        default=99.99,
        help="percentile of |x| for --calibration-method percentile (default 99.99)",
    )
    q.add_argument(
        "--overwrite",
        action="store_true",
        help="allow OUT to be the input model itself (replaced only on success)",
    )
    q.add_argument(
        "--custom-ops-only",
        action="store_true",
        help="write the model even when some onnxq nodes have no standard-ONNX fallback "
        "(scale modes other than floor/ceil, stochastic rounding, NVFP4 activations...): it "
        "then runs only with the onnxq custom-op library, and its metadata and `onnxq "
        "inspect` say so; without this flag such a model is refused",
    )
    q.add_argument(
        "--allow-empty",
        action="store_true",
        help="write OUT even when the formats or recipe select no tensor of the model "
        "(otherwise an error)",
    )
    q.add_argument(
        "--preset",
        metavar="NAME",
        help="a named deployment recipe shipped with onnxq: bfp16-deploy, mx6-deploy, "
        "mx9-deploy, mxfp8-deploy (`--list-presets` shows each recipe); not combined with "
        "--weights/--activations/--recipe",
    )
    q.add_argument(
        "--block-size",
        type=int,
        metavar="N",
        help="with a BFP16 --preset: N values per shared exponent instead of 16 "
        "(int8_e8m0_tN; 8 is the variant other BFP16 tools use)",
    )
    q.add_argument(
        "--list-presets",
        action="store_true",
        help="list the deployment presets with their recipes and files, and exit",
    )
    q.set_defaults(handler=_cmd_quantize)

    r = sub.add_parser(
        "run",
        help="run a model and summarise its outputs",
        description="Run MODEL in onnxruntime (with the onnxq custom ops when "
        "built) and print each output's shape, dtype, min, max and mean.",
    )
    r.add_argument("model", metavar="MODEL", help="the .onnx model")
    _add_input_options(r)
    r.add_argument("--save", metavar="OUT.npz", help="also save the outputs, by name, to OUT.npz")
    r.set_defaults(handler=_cmd_run)

    c = sub.add_parser(
        "compare",
        help="compare a quantized model with its float model",
        description="Run FLOAT and QUANT on the same inputs; per output print "
        "cosine similarity, SQNR in dB, max abs error and, for outputs that look "
        "like logits or probabilities (class axis last), top-1 agreement.",
    )
    c.add_argument("float_model", metavar="FLOAT", help="the float .onnx model")
    c.add_argument("quant_model", metavar="QUANT", help="the quantized .onnx model")
    _add_input_options(c)
    c.add_argument(
        "--layers",
        action="store_true",
        help="also compare the intermediate tensors both graphs compute (matched by "
        "name) and print SQNR per layer",
    )
    c.set_defaults(handler=_cmd_compare)

    i = sub.add_parser(
        "inspect",
        help="list a model's quantized tensors and sizes",
        description="List each quantized tensor (DequantizeMX, CodebookLookup "
        "and blocked DequantizeLinear nodes and their stored inputs): format, "
        "shape, bits per value, bytes; and the weights' size as float and as "
        "stored.",
    )
    i.add_argument("model", metavar="MODEL", help="the .onnx model")
    i.set_defaults(handler=_cmd_inspect)

    f = sub.add_parser(
        "formats",
        help="list the format presets",
        description="List the format presets with their codes and bits per "
        "value (scales included).",
    )
    f.set_defaults(handler=_cmd_formats)

    e = sub.add_parser(
        "export",
        help="write a quantized model's weights in their hardware layouts",
        description="Write every quantized weight of MODEL (DequantizeMX nodes of a packed "
        "model) in the layout hardware reads - BFP int8 [exponents..., mantissas...], MX9/6/4 "
        "16-value records, OCP MX element codes plus E8M0 scales - into DIR/weights.bin, "
        "with DIR/manifest.json (name, shape, tile axis, format, layout, byte offset, length "
        "and sha256 of each blob). docs/layouts.md describes the layouts bit by bit.",
    )
    e.add_argument("model", metavar="MODEL", help="the quantized .onnx model (packed storage)")
    e.add_argument("-o", "--output", required=True, metavar="DIR", help="the output folder")
    e.add_argument(
        "--overwrite",
        action="store_true",
        help="write into DIR even when it is not empty (replaces manifest.json and "
        "weights.bin; other files stay)",
    )
    e.set_defaults(handler=_cmd_export)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``onnxq`` command.

    Args:
        argv: the arguments after the program name (default ``sys.argv[1:]``).

    Returns:
        The exit status: 0 success, 2 bad input, 1 unexpected failure.
    """
    try:
        args = build_parser().parse_args(argv)
        status = int(args.handler(args))
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return status
    except BrokenPipeError:
        return _broken_pipe()
    except SystemExit as done:  # --help and --version
        code = done.code
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            return _broken_pipe()
        return code if isinstance(code, int) else 0 if code is None else EXIT_FAILURE
    except UsageError as err:
        print(f"{_PROG}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{_PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if os.environ.get("ONNXQ_DEBUG"):
            raise
        print(
            f"{_PROG}: internal error: {type(err).__name__}: {_one_line(err)[:300]} "
            f"(set ONNXQ_DEBUG=1 for the traceback and report it)",
            file=sys.stderr,
        )
        return EXIT_FAILURE


def _broken_pipe() -> int:
    """The reader of stdout went away (``| head``): stop quietly, as Unix filters do.

    Python would report the unflushed output at exit; pointing stdout at /dev/null first
    silences that.
    """
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EXIT_BROKEN_PIPE
