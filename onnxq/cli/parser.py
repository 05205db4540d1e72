"""The argument parser of the ``onnxq`` command: one function per subcommand's parser.

Every option is documented in ``--help``; argparse's errors become one-line UsageErrors.
Each subcommand's parser names its handler (`onnxq.cli.commands`) as ``handler``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from typing import Any, NoReturn

from onnxq._version import __version__
from onnxq.cli import commands
from onnxq.cli.common import PROG, UsageError
from onnxq.cli.inputs import count

_Subparsers = Any  # argparse's _SubParsersAction, private


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (argparse prints the usage too)."""

    def error(self, message: str) -> NoReturn:
        """Raise a UsageError instead of printing the usage and exiting."""
        raise UsageError(f"{self.prog}: {message}", f"see `{self.prog} --help`")

    def _print_message(self, message: str, file: Any = None) -> None:
        # argparse swallows OSError here; a closed stdout must reach main's BrokenPipe handling.
        if message:
            (file or sys.stderr).write(message)


def _add_fusing(q: argparse.ArgumentParser) -> None:
    """``--fuse NAMES`` and ``--no-fuse`` (one or the other) of ``onnxq quantize``."""
    fusing = q.add_mutually_exclusive_group()
    fusing.add_argument(
        "--fuse",
        dest="fuse",
        metavar="NAMES",
        type=_fusions,
        help="the fusions to run: comma-separated names (matmul_mx, gather) or `all`; default: "
        "gather only (GatherMX reads only the gathered rows). matmul_mx (MatMulMX) suits "
        "memory-bound decoding (LM decode at batch 1: 0.40x float) and costs ~1.2x float from "
        "64 rows of A on (recipe key `fuse: all` or a list of names does the same)",
    )
    fusing.add_argument(
        "--no-fuse",
        dest="fuse",
        action="store_false",
        help="quantize each activation with a QuantizeMX -> DequantizeMX pair instead of one "
        "QuantizeDequantizeMX node (same values), and merge no packed weight with the op "
        "that reads it (recipe key `fuse: false` does the same)",
    )
    q.set_defaults(fuse=True)


def _fusions(text: str) -> str:
    """An argparse type: ``--fuse`` names (comma-separated) or ``all``, checked."""
    from onnxq.graph.fuse import fusion_names  # lazy: the graph pass imports onnx

    try:
        fusion_names(text, "--fuse")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--fuse: ")) from None
    return text


def _version() -> str:
    parts = []
    for dist in ("onnx", "onnxruntime"):
        try:
            parts.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{dist} missing")
    return f"{PROG} {__version__} ({', '.join(parts)})"


def _add_input_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--inputs",
        metavar="FILE.npz",
        help="input arrays, one per model input, named after it (numpy.savez); "
        "default: random inputs from each input's type and shape",
    )
    p.add_argument(
        "--batch",
        type=count("--batch", 1, 1 << 20),
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
        type=count("--seed", 0, 2**63 - 1),
        default=0,
        help="seed of generated inputs (default 0): floats are standard normal, "
        "integers uniform in [1, 10) (ones for inputs named *mask*), booleans true",
    )


def _add_provider_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cuda",
        action="store_true",
        help="run on onnxruntime's CUDA execution provider (needs onnxruntime-gpu): the onnxq "
        "ops on the library's GPU kernels, nodes without kernels on the CPU (`onnxq inspect` "
        "lists them); default: the CPU provider",
    )
    p.add_argument(
        "--device",
        type=count("--device", 0, 1023),
        metavar="N",
        help="with --cuda: the GPU to run on (default 0)",
    )


def _add_quantize(sub: _Subparsers) -> None:
    """The ``quantize`` subcommand's parser."""
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
    _add_fusing(q)
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
    q.set_defaults(handler=commands.cmd_quantize)


def _add_run(sub: _Subparsers) -> None:
    """The ``run`` subcommand's parser."""
    r = sub.add_parser(
        "run",
        help="run a model and summarise its outputs",
        description="Run MODEL in onnxruntime (with the onnxq custom ops when "
        "built) and print each output's shape, dtype, min, max and mean.",
    )
    r.add_argument("model", metavar="MODEL", help="the .onnx model")
    _add_input_options(r)
    _add_provider_options(r)
    r.add_argument("--save", metavar="OUT.npz", help="also save the outputs, by name, to OUT.npz")
    r.set_defaults(handler=commands.cmd_run)


def _add_compare(sub: _Subparsers) -> None:
    """The ``compare`` subcommand's parser."""
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
    _add_provider_options(c)
    c.add_argument(
        "--layers",
        action="store_true",
        help="also compare the intermediate tensors both graphs compute (matched by "
        "name) and print SQNR per layer",
    )
    c.set_defaults(handler=commands.cmd_compare)


def _add_inspect(sub: _Subparsers) -> None:
    """The ``inspect`` subcommand's parser."""
    i = sub.add_parser(
        "inspect",
        help="list a model's quantized tensors and sizes",
        description="List each quantized tensor (DequantizeMX, CodebookLookup "
        "and blocked DequantizeLinear nodes and their stored inputs): format, "
        "shape, bits per value, bytes; and the weights' size as float and as "
        "stored.",
    )
    i.add_argument("model", metavar="MODEL", help="the .onnx model")
    i.set_defaults(handler=commands.cmd_inspect)


def _add_formats(sub: _Subparsers) -> None:
    """The ``formats`` subcommand's parser."""
    f = sub.add_parser(
        "formats",
        help="list the format presets",
        description="List the format presets with their codes and bits per "
        "value (scales included).",
    )
    f.set_defaults(handler=commands.cmd_formats)


def _add_export(sub: _Subparsers) -> None:
    """The ``export`` subcommand's parser."""
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
    e.set_defaults(handler=commands.cmd_export)


def _add_tune(sub: _Subparsers) -> None:
    """The ``tune`` subcommand's parser."""
    from onnxq.cli.tune import cmd_tune

    t = sub.add_parser(
        "tune",
        help="choose a format per layer: the fewest weight bits that meet an accuracy budget",
        description="Measure each layer's sensitivity to each candidate format, find the "
        "assignment with the fewest weight bits whose outputs meet --budget against float on "
        "the search inputs, check it on held-out inputs, and write OUT, OUT's recipe "
        "(NAME.recipe.yaml, for `onnxq quantize --recipe`) and a report (NAME.tune.json). "
        "docs/tune.md describes the method.",
    )
    t.add_argument("model", metavar="MODEL", help="the float .onnx model")
    t.add_argument("-o", "--output", required=True, metavar="OUT", help="the quantized model")
    t.add_argument(
        "--inputs",
        required=True,
        metavar="DATA",
        help="input samples: a folder of .npz files (one run each, arrays named after the "
        "model inputs) or one .npz whose arrays stack the samples along a new first axis",
    )
    t.add_argument(
        "--budget",
        required=True,
        metavar="EXPR",
        help="the floor on the outputs against float: cosine>=X, sqnr>=DB, top1>=X, or the "
        "ceiling max_abs<=X (each output pooled over the samples; the worst output counts)",
    )
    t.add_argument(
        "--candidates",
        metavar="LIST",
        help="comma-separated formats to choose from, ordered by bits (default "
        "mxfp4,mx6,mxfp6,mxfp8,bfp16; `float` keeps a layer float)",
    )
    mode = t.add_mutually_exclusive_group()
    mode.add_argument(
        "--weights-only",
        action="store_true",
        help="tune the weights only; activations stay as --recipe says (the default)",
    )
    mode.add_argument(
        "--with-activations",
        action="store_true",
        help="quantize each tuned node's activations in its layer's format too",
    )
    t.add_argument(
        "--recipe",
        metavar="FILE",
        help="starting recipe: its op types, exclusions, float overrides, modes and activation "
        "formats are kept; its weight formats are what tune chooses",
    )
    t.add_argument(
        "--holdout",
        type=float,
        default=0.25,
        metavar="F",
        help="fraction of the samples held out of the search to check its result (default "
        "0.25: every 4th sample)",
    )
    t.add_argument(
        "--workers",
        type=count("--workers", 1, 1024),
        default=1,
        metavar="N",
        help="local worker processes running trials side by side (default 1: in this process)",
    )
    t.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run the trials as Ray tasks on the cluster at ADDRESS (host:port, "
        "ray://host:port, auto) or `local` (start Ray here); needs pip install 'onnxq[ray]'",
    )
    t.add_argument(
        "--cache",
        metavar="DIR",
        help="folder of finished trials, reused by later searches on the same model and inputs",
    )
    t.add_argument(
        "--storage",
        choices=("packed", "fake"),
        default="packed",
        help="how OUT stores the weights (as in quantize; default packed)",
    )
    t.add_argument(
        "--plot",
        action="store_true",
        help="also write the explored frontier, bits against the metric (NAME.frontier.png; "
        "needs matplotlib)",
    )
    t.add_argument("--overwrite", action="store_true", help="allow OUT to replace the input model")
    t.set_defaults(handler=cmd_tune)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``onnxq`` command (every option documented in ``--help``)."""
    parser = _Parser(
        prog=PROG,
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
    # The order of the subcommands in --help.
    for add in (_add_quantize, _add_run, _add_compare, _add_inspect, _add_formats, _add_export):
        add(sub)
    _add_tune(sub)
    return parser
