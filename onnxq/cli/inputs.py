"""Running models for ``onnxq run`` and ``onnxq compare``: sessions, inputs, saved outputs.

Inputs come from an ``.npz`` file (``--inputs``) or are generated from each model input's
type and shape, seeded (``--seed``), so ``run`` and ``compare`` make the same ones. Every
failure is a one-line `UsageError` that names the option to change.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from onnxq import _output
from onnxq.cli.common import UsageError, existing_file, one_line

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
_MAX_GENERATED = 1 << 30  # values per generated input (4 GiB of float32)


def providers(cuda_device: int | None) -> list[Any]:
    """The providers to ask for: the CPU, or the CUDA provider on ``cuda_device`` first.

    Raises:
        UsageError: a CUDA device was asked for and this onnxruntime has no CUDA provider.
    """
    if cuda_device is None:
        return ["CPUExecutionProvider"]
    import onnxruntime as ort

    have = ort.get_available_providers()
    if "CUDAExecutionProvider" not in have:
        raise UsageError(
            f"--cuda: this onnxruntime ({ort.__version__}) has no CUDA execution provider "
            f"(it has {', '.join(have)})",
            "install onnxruntime-gpu in place of onnxruntime, or leave out --cuda",
        )
    cuda = ("CUDAExecutionProvider", {"device_id": str(cuda_device)})
    return [cuda, "CPUExecutionProvider"]


def session(model: Path | onnx.ModelProto, label: str, cuda_device: int | None = None) -> Any:
    """An onnxruntime session, with the onnxq custom ops when the library is built.

    Without the library a plain session still runs what onnxq writes (function fallbacks).
    ``cuda_device``: run on the CUDA provider on that GPU (the CPU provider takes the rest).

    Raises:
        UsageError: onnxruntime cannot load the model, or has no working CUDA provider.
    """
    import onnxruntime as ort

    from onnxq import runtime

    chosen = providers(cuda_device)
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the command reports errors itself, in one line
    try:
        if runtime.has_custom_ops():
            source: Any = str(model) if isinstance(model, Path) else model
            sess = runtime.session(source, sess_options=options, providers=chosen)
        else:
            source = str(model) if isinstance(model, Path) else model.SerializeToString()
            sess = ort.InferenceSession(source, sess_options=options, providers=chosen)
    except Exception as err:  # onnxruntime raises its own exception types
        raise UsageError(
            f"onnxruntime cannot load {label}: {one_line(err)[:300]}",
            "check the model with onnx.checker; models with onnxq ops need the custom-op "
            "library (pip install -e .) or embedded function fallbacks",
        ) from None
    if cuda_device is not None and "CUDAExecutionProvider" not in sess.get_providers():
        # onnxruntime falls back to the CPU when its CUDA provider cannot start
        raise UsageError(
            f"--cuda: onnxruntime could not start its CUDA provider on device {cuda_device} "
            f"for {label} (the session has {', '.join(sess.get_providers())})",
            "check the GPU (nvidia-smi), --device, and the CUDA and cuDNN libraries "
            "onnxruntime-gpu needs",
        )
    return sess


def count(option: str, low: int, high: int) -> Callable[[str], int]:
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


def parse_dims(items: Sequence[str] | None) -> dict[str, int]:
    """``--dim NAME=SIZE`` values as a dict."""
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


def feeds(
    inputs: Sequence[Any], npz: str | None, batch: int, dims: Mapping[str, int], seed: int
) -> dict[str, np.ndarray]:
    """Inputs for a session: arrays from ``npz``, or generated from each input's type and shape.

    Generated inputs are seeded, so ``run`` and ``compare`` make the same ones.
    """
    if npz is None:
        rng = np.random.default_rng(seed)
        return {arg.name: _generated(arg, rng, batch, dims) for arg in inputs}
    path = existing_file(npz, "--inputs")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as err:
        raise UsageError(
            f"--inputs {npz!r} is not a readable .npz file ({one_line(err)[:120]})",
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
    result = {}
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
        result[arg.name] = got
    return result


def run_session(sess: Any, inputs: Mapping[str, np.ndarray], names: list[str], label: str) -> list:
    """The outputs ``names`` of one run of ``sess``; a failed run is a UsageError."""
    try:
        return list(sess.run(names, dict(inputs)))
    except Exception as err:
        raise UsageError(
            f"running {label} failed: {one_line(err)[:300]}",
            "check the input shapes and types (--inputs, --batch, --dim)",
        ) from None


def save_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` as .npz, through a temporary file renamed into place."""
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
