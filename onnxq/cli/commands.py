"""The handlers of the ``onnxq`` subcommands: check the arguments, call onnxq, print.

Each ``cmd_*`` takes the parsed arguments and returns the exit status; bad input raises a
`UsageError`. The work itself lives in the library: `onnxq.quantize_model`,
`onnxq.graph.inspect`, `onnxq.compare`, `onnxq.deploy.export`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

import onnxq
from onnxq import compare
from onnxq._files import load_model as load_full_model
from onnxq.cli.common import (
    PROG,
    UsageError,
    existing_file,
    external_inputs,
    format_arg,
    human,
    load_model,
    not_an_input,
    one_line,
    output_path,
    same_file,
    table,
)
from onnxq.cli.inputs import feeds, parse_dims, run_session, save_npz, session
from onnxq.graph.inspect import (
    CudaPlacement,
    MalformedNodeError,
    QuantizedTensor,
    cuda_placement,
    file_bytes,
    inspect_model,
    skipped_activations,
)
from onnxq.progress import ProgressBar


# -- quantize --------------------------------------------------------------------------------
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
    given = (("--weights", args.weights), ("--activations", args.activations))
    clash = [o for o, v in (*given, ("--recipe", args.recipe)) if v]
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


def _required(args: argparse.Namespace) -> None:
    """MODEL and -o are optional to argparse (``--list-presets`` needs neither)."""
    for value, name in ((args.model, "MODEL"), (args.output, "-o/--output")):
        if value is None:
            raise UsageError(
                f"quantize: the following arguments are required: {name}",
                "see `onnxq quantize --help`",
            )


def _quantize_options(
    args: argparse.Namespace, src: Path, model: onnx.ModelProto
) -> tuple[Path, dict[str, Any]]:
    """The checked output path, and the quantizer's keyword arguments checked here."""
    out = output_path(args.output, "-o/--output")
    if same_file(src, out) and not args.overwrite:
        raise UsageError(
            f"the output {args.output!r} is the input model",
            "write to another path with -o, or pass --overwrite to replace the input",
        )
    not_an_input(out, "-o/--output", [("--recipe file", args.recipe), *external_inputs(src, model)])
    weights = format_arg(args.weights, "--weights")
    activations = format_arg(args.activations, "--activations")
    recipe: Any = str(existing_file(args.recipe, "--recipe")) if args.recipe else None
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
    options = {"weights": weights, "activations": activations, "recipe": recipe}
    options["calibration"] = calibration
    return out, options


def _quantize(
    args: argparse.Namespace, src: Path, out: Path, options: dict[str, Any]
) -> onnx.ModelProto:
    """Run the quantizer; its warnings are printed after the work, one line each."""
    quantize = _quantizer()
    bar = ProgressBar()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:  # writes beside `out` and renames, removing what it left if it fails
                result = quantize(
                    str(src),
                    str(out),
                    **options,
                    weight_storage=args.storage,
                    target=args.target,
                    calibration_method=args.calibration_method,
                    percentile=args.percentile,
                    progress=bar,
                    overwrite=args.overwrite,
                    custom_ops_only=args.custom_ops_only,
                    allow_empty=args.allow_empty,
                    fuse=args.fuse,
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
        print(f"{PROG}: warning: {one_line(warning.message)}", file=sys.stderr)
    return result


def cmd_quantize(args: argparse.Namespace) -> int:
    """``onnxq quantize``: write the quantized model and print one summary line."""
    if args.list_presets:
        return _list_presets()
    _required(args)
    src, model = load_model(args.model)
    out, options = _quantize_options(args, src, model)
    before = file_bytes(src, model)
    start = time.monotonic()
    result = _quantize(args, src, out, options)
    after = file_bytes(out, onnx.load(str(out), load_external_data=False))
    label = None if args.preset else args.recipe
    block = f" block {args.block_size}" if args.block_size else ""
    formats = ", ".join(
        f"{what} {fmt}"
        for what, fmt in (
            ("weights", options["weights"]),
            ("activations", options["activations"]),
            ("recipe", label),
            ("preset", f"{args.preset}{block}" if args.preset else None),
        )
        if fmt
    )
    print(
        f"{src.name} -> {out}: {human(before)} -> {human(after)} ({after / before:.1%}); "
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
    skipped = skipped_activations(meta)
    if skipped:
        parts.append(f"{len(skipped)} activation(s) left float (onnxq inspect says why)")
    if "onnxq_custom_ops_only" in meta:
        parts.append("custom-op-only model: it runs only with the onnxq custom-op library")
    return "".join(f"; {p}" for p in parts)


# -- run -------------------------------------------------------------------------------------
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
    return table(["output", "shape", "dtype", "min", "max", "mean", ""], rows)


def cmd_run(args: argparse.Namespace) -> int:
    """``onnxq run``: run the model once and print each output's summary."""
    src, model = load_model(args.model)
    save = output_path(args.save, "--save") if args.save else None
    if save is not None:
        inputs = [("model", args.model), ("--inputs file", args.inputs)]
        not_an_input(save, "--save", [*inputs, *external_inputs(src, model)])
    device = _cuda_device(args)
    sess = session(src, repr(args.model), device)
    if device is not None:
        _cuda_note(model, repr(args.model))
    values = feeds(sess.get_inputs(), args.inputs, args.batch, parse_dims(args.dim), args.seed)
    names = [o.name for o in sess.get_outputs()]
    outputs = run_session(sess, values, names, repr(args.model))
    if save is not None:
        save_npz(save, dict(zip(names, outputs, strict=True)))
    print(_summaries(names, outputs))
    if save is not None:
        print(f"saved {len(names)} outputs to {save}")
    return 0


# -- compare ---------------------------------------------------------------------------------
def _fmt(value: float, spec: str) -> str:
    return "inf" if value == math.inf else "-inf" if value == -math.inf else format(value, spec)


def _shape(a: np.ndarray) -> str:
    return "x".join(map(str, a.shape)) or "scalar"


def _sessions(args: argparse.Namespace) -> tuple[Any, Any, list[str], onnx.ModelProto]:
    """The float and quantized sessions, the layers both expose and the float model."""
    f_src, f_model = load_model(args.float_model)
    q_src, q_model = load_model(args.quant_model)
    layers: list[str] = []
    f_target: Path | onnx.ModelProto = f_src
    q_target: Path | onnx.ModelProto = q_src
    if args.layers:
        f_full = load_full_model(f_src)
        q_full = load_full_model(q_src)
        wanted = compare.layer_candidates(f_full, q_full)
        in_quant = set(compare.expose_outputs(q_full, wanted))
        layers = [n for n in compare.expose_outputs(f_full, wanted) if n in in_quant]
        f_target, q_target = f_full, q_full
    device = _cuda_device(args)
    f_sess = session(f_target, repr(args.float_model), device)
    q_sess = session(q_target, repr(args.quant_model), device)
    if device is not None:
        _cuda_note(q_model, repr(args.quant_model))
    return f_sess, q_sess, layers, f_model


def _cuda_device(args: argparse.Namespace) -> int | None:
    """The GPU of ``--cuda`` (``--device``, default 0), or None for the CPU provider."""
    if args.device is not None and not args.cuda:
        raise UsageError(f"--device {args.device} needs --cuda", "add --cuda, or drop --device")
    return (args.device or 0) if args.cuda else None


def _cuda_note(model: onnx.ModelProto, label: str) -> None:
    """One line on stderr when onnxq nodes of the model run on the CPU at each run."""
    from onnxq import runtime

    placement = cuda_placement(model)
    if placement.unknown and runtime.has_custom_ops():  # a library without GPU kernels
        print(
            f"note: the onnxq nodes of {label} run on the CPU with the CUDA provider: "
            f"{one_line(placement.unknown)[:200]}",
            file=sys.stderr,
        )
    elif placement.cpu_at_run:
        print(
            f"note: {placement.cpu_at_run} onnxq node(s) of {label} run on the CPU with the "
            "CUDA provider (no GPU kernel for their format, modes or op); `onnxq inspect` "
            "lists them with the reasons",
            file=sys.stderr,
        )


def _output_pairs(f_sess: Any, q_sess: Any, layers: list[str]) -> list[tuple[str, str]]:
    """(float, quantized) output names to compare: by name, else by position."""
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
    return pairs


def _output_row(name: str, a: np.ndarray, b: np.ndarray, producer: str | None) -> list[str]:
    if a.shape != b.shape:
        return [name, f"{a.shape} vs {b.shape}", "-", "-", "-", "-"]
    m = compare.error_metrics(a, b)
    top1 = "-"
    if compare.looks_like_scores(name, a, producer):
        top1 = f"{compare.top1_agreement(a, b):.2%}"
    sqnr = _fmt(m["sqnr"], ".2f")
    return [name, _shape(a), f"{m['cos']:.6f}", sqnr, f"{m['max_abs']:.4g}", top1]


def _layer_table(
    layers: Sequence[str],
    f_vals: Mapping[str, np.ndarray],
    q_vals: Mapping[str, np.ndarray],
    producers: Mapping[str, str],
) -> str:
    """The per-layer table of ``compare --layers``: tensors of equal shape in both models."""
    rows = []
    for name in layers:
        a, b = np.asarray(f_vals[name]), np.asarray(q_vals[name])
        if a.shape != b.shape:
            continue
        m = compare.error_metrics(a, b)
        op = producers.get(name, "?")
        sqnr = _fmt(m["sqnr"], ".2f")
        rows.append([name, op, _shape(a), sqnr, f"{m['cos']:.6f}", f"{m['max_abs']:.4g}"])
    if not rows:
        return "no intermediate tensor is shared by both graphs"
    return table(["tensor", "op", "shape", "SQNR dB", "cosine", "max abs err"], rows)


def cmd_compare(args: argparse.Namespace) -> int:
    """``onnxq compare``: run both models on the same inputs and print the error per output."""
    f_sess, q_sess, layers, f_model = _sessions(args)
    pairs = _output_pairs(f_sess, q_sess, layers)
    values = feeds(f_sess.get_inputs(), args.inputs, args.batch, parse_dims(args.dim), args.seed)
    f_names = [f for f, _ in pairs] + layers
    q_names = [q for _, q in pairs] + layers
    f_out = run_session(f_sess, values, f_names, "the float model")
    f_vals = dict(zip(f_names, f_out, strict=True))
    q_out = run_session(q_sess, values, q_names, "the quantized model")
    q_vals = dict(zip(q_names, q_out, strict=True))
    producers = compare.producers(f_model.graph)
    rows = [
        _output_row(f, np.asarray(f_vals[f]), np.asarray(q_vals[q]), producers.get(f))
        for f, q in pairs
    ]
    report = [table(["output", "shape", "cosine", "SQNR dB", "max abs err", "top-1"], rows)]
    if args.layers:
        report += ["", _layer_table(layers, f_vals, q_vals, producers)]
    print("\n".join(report))
    return 0


# -- inspect ---------------------------------------------------------------------------------
def _inspect_row(t: QuantizedTensor) -> list[object]:
    shape = "x".join("?" if d < 0 else str(d) for d in t.shape) or "scalar"
    if t.tiled_shape is not None:  # a short reduction axis, tiled as a matrix
        shape += f" (tiled {'x'.join(map(str, t.tiled_shape))})"
    if t.kind == "weight":
        bits = "-" if t.bits_per_value is None else f"{t.bits_per_value:.3f}"
        return [t.name, t.kind, t.format, shape, bits, t.nbytes]
    bits = "?" if t.bits_per_value is None else f"{t.bits_per_value:g}"
    return [t.name, t.kind, t.format, shape, bits, "-"]


def cmd_inspect(args: argparse.Namespace) -> int:
    """``onnxq inspect``: list the quantized tensors and the weights' sizes."""
    src, model = load_model(args.model)
    try:
        found = inspect_model(model)
    except MalformedNodeError as err:
        raise UsageError(str(err)) from None
    lines = [
        f"{src}: {found.nodes} nodes, {found.stored_tensors} stored tensors, "
        f"file {human(file_bytes(src, model))}"
    ]
    listed = {"onnxq_skipped"}  # printed in full below
    lines += [
        f"  {k}: {one_line(v)[:200]}" for k, v in sorted(found.metadata.items()) if k not in listed
    ]
    if found.tensors:
        rows = [_inspect_row(t) for t in found.tensors]
        lines += ["", table(["tensor", "kind", "format", "shape", "bits/value", "bytes"], rows)]
    else:
        lines += [
            "no quantized tensors (no DequantizeMX, CodebookLookup or blocked "
            "DequantizeLinear; fake-quantized weights are stored as float)"
        ]
    lines += ["", f"activations: {found.activations} quantized, {len(found.skipped)} left float"]
    lines += [
        f"  left float: {one_line(s['tensor'])[:120]} (read by {one_line(s['consumers'])[:120]})"
        f": {one_line(s['reason'])[:300]}"
        for s in found.skipped
    ]
    before, after = found.float_bytes, found.stored_bytes
    lines += [
        "",
        f"weights: {human(before)} as float -> {human(after)} stored ({after / before:.1%})"
        if before
        else "weights: none",
    ]
    cuda = _cuda_lines(cuda_placement(model))
    lines += ["", *cuda] if cuda else []
    print("\n".join(lines))
    return 0


def _cuda_lines(p: CudaPlacement) -> list[str]:
    """Where onnxruntime's CUDA provider would run the onnxq nodes (none: no lines)."""
    label = "onnxruntime CUDA provider"
    if p.unknown:
        return [f"{label}: not known here ({one_line(p.unknown)[:200]})"]
    if not p.nodes:
        return []
    if not p.cpu:
        return [f"{label}: all {p.nodes} onnxq nodes on the library's GPU kernels"]
    on_cpu = p.nodes - p.kernels
    lines = [
        f"{label}: {p.nodes} onnxq nodes, {p.kernels} on the library's GPU kernels, "
        f"{on_cpu} on the CPU:"
    ]
    for why, names in sorted(p.cpu.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {len(names)} (e.g. {one_line(names[0])[:80]!r}): {one_line(why)[:300]}")
    return lines


# -- export and formats ----------------------------------------------------------------------
def cmd_export(args: argparse.Namespace) -> int:
    """``onnxq export``: write the quantized weights in their hardware layouts."""
    from onnxq.deploy import export as exporter

    src, _ = load_model(args.model)
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
            f"{one_line(err)[:200]})",
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
        f"{src.name} -> {out}: {len(tensors)} weights, {human(total)} in "
        f"{manifest['data_file']} ({', '.join(layouts)}); manifest.json"
    )
    return 0


def cmd_formats(args: argparse.Namespace) -> int:
    """``onnxq formats``: list the format presets."""
    rows = [[name, dt.code, f"{dt.bits_per_value:g}"] for name, dt in onnxq.datatypes().items()]
    print(table(["preset", "code", "bits/value"], rows))
    print(
        "\nAny data type code works too, e.g. e2m1fnuz_e8m0_t32 or cb41fi_e2m2fnuz_e8m0_t32 "
        "(README: The format language)."
    )
    return 0
