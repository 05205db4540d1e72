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

import contextlib
import os
import sys
from collections.abc import Sequence

from onnxq.cli.common import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILURE,
    EXIT_USAGE,
    PROG,
    UsageError,
    one_line,
)
from onnxq.cli.parser import build_parser

__all__ = ["EXIT_FAILURE", "EXIT_USAGE", "UsageError", "build_parser", "main"]


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
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if os.environ.get("ONNXQ_DEBUG"):
            raise
        print(
            f"{PROG}: internal error: {type(err).__name__}: {one_line(err)[:300]} "
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
