"""The inputs of a search: loading the samples, the search / held-out split, their hash.

Samples come from a folder of ``.npz`` files (one model run each, arrays named after the model
inputs, read in file-name order), from one ``.npz`` whose arrays stack the samples along a new
first axis (``numpy.savez(f, x=np.stack([x0, x1, ...]))``: sample i is ``x[i]``), or, in
Python, from a sequence of dicts. The split is fixed and documented: with a held-out fraction
f (default 0.25), sample i (0-based) is held out when ``floor((i + 1) f) > floor(i f)``, i.e.
every 4th sample (3, 7, 11, ...) at 0.25; the search never sees those samples, and at least one
sample falls on each side (so at least two samples are needed).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Sample", "check_against", "inputs_hash", "load_samples", "split"]

Sample = dict[str, np.ndarray]
_MAX_FILES = 100_000


def _read_npz(path: Path) -> Sample:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: np.asarray(data[k]) for k in data.files}
    except Exception as err:
        first = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
        raise ValueError(f"inputs file {str(path)!r} is not a readable .npz ({first})") from None


def load_samples(source: str | os.PathLike[str] | Sequence[Mapping[str, Any]]) -> list[Sample]:
    """The samples of ``source`` (see the module doc), as dicts of numpy arrays.

    Raises:
        ValueError: a missing path, an unreadable file, arrays of unequal sample counts, or
            no sample at all.
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix == ".npz" and p.is_file())
            if len(files) > _MAX_FILES:
                raise ValueError(f"inputs folder {str(path)!r} has over {_MAX_FILES} .npz files")
            samples = [_read_npz(p) for p in files]
            where = f"inputs folder {str(path)!r}"
        elif path.is_file():
            stacked = _read_npz(path)
            counts = {k: (a.shape[0] if a.ndim else None) for k, a in stacked.items()}
            if not stacked or None in counts.values() or len(set(counts.values())) != 1:
                raise ValueError(
                    f"inputs file {str(path)!r}: expected arrays that stack the samples along "
                    f"their first axis, all of one length; got shapes "
                    f"{ {k: list(a.shape) for k, a in stacked.items()} }"
                )
            n = next(iter(counts.values()))
            samples = [{k: a[i] for k, a in stacked.items()} for i in range(n)]
            where = f"inputs file {str(path)!r}"
        else:
            raise ValueError(f"inputs {str(path)!r} do not exist (give a .npz file or a folder)")
    else:
        samples = []
        for i, s in enumerate(source):
            if not isinstance(s, Mapping):
                raise ValueError(f"input sample {i} is a {type(s).__name__}, not a dict")
            samples.append({str(k): np.asarray(v) for k, v in s.items()})
        where = "inputs"
    if not samples:
        raise ValueError(f"{where} hold no sample; give at least two (one is held out)")
    return samples


def check_against(samples: Sequence[Sample], inputs: Sequence[Any]) -> list[Sample]:
    """Samples with each array cast to its model input's type (onnxruntime ``NodeArg``s).

    Raises:
        ValueError: names that differ from the model's inputs, or a type that cannot be cast.
    """
    types = {
        "tensor(float)": np.float32,
        "tensor(float16)": np.float16,
        "tensor(double)": np.float64,
        "tensor(int32)": np.int32,
        "tensor(int64)": np.int64,
        "tensor(bool)": np.bool_,
    }
    names = [a.name for a in inputs]
    result = []
    for i, sample in enumerate(samples):
        if sorted(sample) != sorted(names):
            raise ValueError(
                f"input sample {i} has arrays {sorted(sample)} but the model takes {names}; "
                "name each array after a model input"
            )
        fixed = {}
        for arg in inputs:
            want, got = types.get(arg.type), sample[arg.name]
            if want is not None and got.dtype != want:
                if not np.can_cast(got.dtype, want, "same_kind"):
                    raise ValueError(
                        f"input sample {i}: array {arg.name!r} is {got.dtype}, the model "
                        f"wants {arg.type}"
                    )
                got = got.astype(want)
            fixed[arg.name] = np.ascontiguousarray(got)
        result.append(fixed)
    return result


def split(n: int, holdout: float) -> tuple[list[int], list[int]]:
    """(search indices, held-out indices) of ``n`` samples (rule: the module doc).

    Raises:
        ValueError: fewer than two samples, or a fraction outside (0, 1).
    """
    if not 0.0 < holdout < 1.0:
        raise ValueError(f"held-out fraction {holdout!r} must be in (0, 1), e.g. 0.25")
    if n < 2:
        raise ValueError(
            f"{n} input sample: tune needs at least two (the budget is checked on samples "
            "held out from the search)"
        )
    held = [i for i in range(n) if math.floor((i + 1) * holdout) > math.floor(i * holdout)]
    if not held:
        held = [n - 1]
    if len(held) == n:
        held = held[1:]
    search = [i for i in range(n) if i not in set(held)]
    return search, held


def inputs_hash(samples: Sequence[Sample]) -> str:
    """A sha256 of the samples' names, types, shapes and bytes (a cache key part)."""
    h = hashlib.sha256()
    for sample in samples:
        for name in sorted(sample):
            a = np.ascontiguousarray(sample[name])
            h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
            h.update(a.tobytes())
        h.update(b"\n")
    return h.hexdigest()
