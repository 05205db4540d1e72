"""The handler of ``onnxq tune``: check the arguments, run `onnxq.tuning.tune`, print the table."""

from __future__ import annotations

import argparse
from pathlib import Path

from onnxq.cli.common import UsageError, load_model, not_an_input, output_path
from onnxq.progress import ProgressBar


def cmd_tune(args: argparse.Namespace) -> int:
    """``onnxq tune``: search per-layer formats under a budget; write model, recipe, report."""
    from onnxq.tuning import tune
    from onnxq.tuning.report import output_paths

    src, _ = load_model(args.model)
    out = output_path(args.output, "-o/--output")
    inputs = [("model", args.model), ("--inputs", args.inputs), ("--recipe file", args.recipe)]
    for path in output_paths(out).values():
        not_an_input(path, "-o/--output", inputs)
    if args.cache and Path(args.cache).exists() and not Path(args.cache).is_dir():
        raise UsageError(f"--cache {args.cache!r} is a file", "give a folder (made if missing)")
    bar = ProgressBar()
    try:
        result = tune(
            str(src),
            args.inputs,
            args.budget,
            str(out),
            candidates=args.candidates,
            weights_only=not args.with_activations,
            recipe=args.recipe,
            holdout=args.holdout,
            workers=args.workers,
            ray=args.ray,
            cache=args.cache,
            weight_storage=args.storage,
            plot=args.plot,
            progress=bar,
            overwrite=args.overwrite,
        )
    except (ValueError, TypeError, NotImplementedError) as err:
        raise UsageError(str(err)) from None
    except OSError as err:
        raise UsageError(
            f"cannot write {args.output!r} ({err.strerror or err})",
            "choose a writable folder with free space",
        ) from None
    print(result.table())
    print("wrote " + ", ".join(str(p) for p in result.files.values()))
    return 0
