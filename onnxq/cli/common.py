"""What every ``onnxq`` subcommand shares: the usage error, exit statuses, text and path checks.

A `UsageError` is bad input: `onnxq.cli.main` prints its one line and exits with status 2.
The path checks refuse, in one line naming the fix, what would otherwise fail later with a
traceback: missing or truncated models, external data outside the model's folder, output
paths in missing folders or naming an input file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import onnx

import onnxq
from onnxq._files import check_external
from onnxq.graph.inspect import data_files

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a filter killed by SIGPIPE
PROG = "onnxq"


class UsageError(Exception):
    """Bad input: the command stops with exit status 2 and this one-line message."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        """Record the problem and, when there is one, how to fix it.

        Args:
            problem: what is wrong, naming the path, option or value.
            fix: what the user should do instead.
        """
        text = one_line(problem)
        super().__init__(f"{text}; {fix}" if fix else text)


def one_line(text: object) -> str:
    """``text`` as one line, runs of whitespace (newlines included) made one space."""
    return " ".join(str(text).split())


def human(nbytes: float) -> str:
    """A byte count in B, kB, MB or GB (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(nbytes) < 1000 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")  # pragma: no cover


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table with a dashed rule under the headers; empty columns are dropped."""
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


def existing_file(path: str, what: str) -> Path:
    """``path`` when it names a file; a UsageError naming ``what`` otherwise."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{what} {path!r} is a directory, not a file", "give a file inside it")
    if not p.is_file():
        raise UsageError(f"{what} {path!r} does not exist", "check the path")
    return p


def load_model(path: str) -> tuple[Path, onnx.ModelProto]:
    """Check that ``path`` is a complete ONNX model; load its graph without external data."""
    p = existing_file(path, "model")
    fix = "give a complete .onnx file (export or copy it again)"
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as err:  # protobuf's DecodeError and friends: not ONNX, or cut short
        raise UsageError(
            f"{path!r} is not an ONNX model or is truncated ({one_line(err)[:120]})", fix
        ) from None
    if model.ir_version <= 0 or not model.HasField("graph") or not model.opset_import:
        raise UsageError(f"{path!r} is not an ONNX model or is truncated (no graph or opset)", fix)
    try:  # every command refuses external data outside the model's folder before reading
        check_external(model, p.parent)
    except ValueError as err:
        raise UsageError(
            f"model {path!r}: {one_line(err)}",
            "keep external data files beside the model and name them by relative paths",
        ) from None
    return p, model


def external_inputs(path: Path, model: onnx.ModelProto) -> list[tuple[str, str]]:
    """("model's external data file", path) of each file the model's tensors refer to."""
    return [("model's external data file", str(path.parent / n)) for n in data_files(model)]


def same_file(a: Path, b: Path) -> bool:
    """True when ``b`` exists and is the file ``a`` names."""
    try:
        return b.exists() and os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def output_path(path: str, option: str) -> Path:
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


def not_an_input(out: Path, option: str, inputs: Sequence[tuple[str, str | None]]) -> None:
    """Refuse an output path that names one of the command's input files."""
    for what, path in inputs:
        if path and same_file(Path(path), out):
            raise UsageError(
                f"{option} {str(out)!r} is the {what}, which onnxq never overwrites",
                "write the output to another path",
            )


def format_arg(value: str | None, option: str) -> str | None:
    """A format option's value, checked to be a preset or data type code (None passes)."""
    if value is None:
        return None
    try:
        onnxq.datatype(value)
    except (ValueError, TypeError) as err:
        raise UsageError(
            f"unknown format {value!r} for {option} ({one_line(err)})",
            "run `onnxq formats` for the presets, or give a data type code such as "
            "e2m1fnuz_e8m0_t32",
        ) from None
    return value
