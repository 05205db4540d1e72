"""onnxruntime sessions with the onnxq custom ops (QuantizeMX, DequantizeMX, CodebookLookup).

The implementation behind `onnxq.runtime`, in the graph layer so that calibration
(`onnxq.graph.calibrate`) can run models with onnxq nodes without importing upwards.
`library_path` gives the custom-op library for any onnxruntime host
(``SessionOptions.register_custom_ops_library``); `session` builds a ready
``onnxruntime.InferenceSession``.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path
from typing import Any

import onnx

from onnxq._files import check_external, load_model
from onnxq.cast import native
from onnxq.graph.load_decode import (
    DECODE_MODES,
    release_freed_memory,
    rename_dtype,
    session_model,
)
from onnxq.graph.schemas import DOMAIN, infer_shapes
from onnxq.graph.walk import trim_value_info, value_info_names

__all__ = ["has_custom_ops", "library_path", "session"]

_BUILD_HINT = (
    "build it with `python -m pip install -e .` (needs cmake, a C++17 compiler and the "
    "onnxruntime C API headers: ONNXRUNTIME_INCLUDE_DIR, a system install, or Debian's "
    "libonnxruntime-dev fetched by ops/fetch_ort_headers.sh)"
)


def library_path() -> str:
    """Return the path of libonnxq_ops, the library that holds the custom ops.

    Returns:
        The library's path, for ``SessionOptions.register_custom_ops_library``.

    Raises:
        FileNotFoundError: the library is not built, or was built without the custom ops
            (no onnxruntime headers were found at build time).
    """
    path = native.library_path()
    if path is None:
        raise FileNotFoundError(
            f"the onnxq library {native.LIBRARY_NAME} is not built; {_BUILD_HINT}"
        )
    if not _exports_custom_ops(str(path)):
        raise FileNotFoundError(
            f"{path} was built without the onnxruntime custom ops (no onnxruntime headers were "
            f"found at build time); re-{_BUILD_HINT[0].lower()}{_BUILD_HINT[1:]}"
        )
    return str(path)


@functools.lru_cache(maxsize=4)
def _exports_custom_ops(path: str) -> bool:
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return False
    return hasattr(lib, "RegisterCustomOps")


def has_custom_ops() -> bool:
    """True when the library is built with the onnxruntime custom ops."""
    try:
        library_path()
    except FileNotFoundError:
        return False
    return True


def _as_model(
    path_or_model: str | os.PathLike[str] | bytes | onnx.ModelProto,
) -> tuple[onnx.ModelProto, Path]:
    """The model and the folder its external data is read from."""
    # External data must be regular files inside the model's folder; a ModelProto or bytes
    # has none, so onnxruntime reads its external data relative to the working directory.
    if isinstance(path_or_model, (onnx.ModelProto, bytes)):
        model = (
            path_or_model
            if isinstance(path_or_model, onnx.ModelProto)
            else onnx.load_from_string(path_or_model)
        )
        check_external(model, Path.cwd())
        return model, Path.cwd()
    if isinstance(path_or_model, (str, os.PathLike)):
        return load_model(path_or_model), Path(path_or_model).parent
    raise TypeError(
        f"session expects a model path, serialized bytes or an onnx.ModelProto, got "
        f"{type(path_or_model).__name__}"
    )


def session(
    path_or_model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    *,
    decode_weights: str = "load",
    **kwargs: Any,
) -> Any:
    """Create an ``onnxruntime.InferenceSession`` with the onnxq custom ops registered.

    onnxruntime cannot infer the output types of custom ops that depend on attributes (the
    Scale type from ``dtype``, Y's from ``output_type``), so the model first goes through ONNX
    shape inference with the onnxq schemas (`onnxq.graph.schemas`), which records them.

    With ``decode_weights="load"`` (the default), each ``DequantizeMX`` / ``CodebookLookup``
    node of the main graph whose inputs are all constant initializers and whose output is no
    graph output runs once here, in the op's own kernel, and onnxruntime receives the decoded
    weight as a plain initializer in the node's ``output_type`` (`onnxq.graph.load_decode`):
    it pre-packs it as it does a float model's weight and runs the float graph's kernels, at
    the float model's speed and memory. The decoded values are the op's bits; the outputs can
    differ from ``"run"``'s in the last bits only where onnxruntime computes with a constant
    weight differently (a pre-packed GEMM, fusions that need constant weights), as it does for
    the float model. ``"run"`` hands the packed model over as it is: the op decodes (or copies
    what it decoded at creation, docs/ops.md "Constant weights") on every run. Fused ops
    (MatMulMX, GatherMX) and decoders inside subgraphs decode at run time either way.

    Args:
        path_or_model: a model file path, serialized model bytes or an ``onnx.ModelProto``
            (not modified).
        decode_weights: ``"load"`` or ``"run"``: when constant weights are decoded.
        **kwargs: passed to ``InferenceSession``; ``sess_options`` (registered with the library
            here, unless load-time decoding left no onnxq node; pass a fresh one) and
            ``providers`` (default ``["CPUExecutionProvider"]``).

    Returns:
        The session.

    Raises:
        FileNotFoundError: the custom-op library is not built (see `library_path`).
        ValueError: an onnxq node has a bad ``dtype``, ``axis``, ``shape`` or ``output_type``
            (the message starts with the op name in brackets; with ``decode_weights="load"``
            also a constant weight whose inputs fail the op's checks), an unknown
            ``decode_weights``, or external data that is not
            a regular file inside the model's folder (the working directory for a ModelProto
            or bytes) or does not fit it.
        TypeError: ``path_or_model`` has an unsupported type.
    """
    import onnxruntime as ort

    if decode_weights not in DECODE_MODES:
        raise ValueError(
            f"decode_weights={decode_weights!r} is not one of {', '.join(DECODE_MODES)}: "
            "'load' decodes constant weights when the session is created, 'run' on every run"
        )
    lib = library_path()
    options = kwargs.pop("sess_options", None) or ort.SessionOptions()
    kwargs.setdefault("providers", ["CPUExecutionProvider"])
    if decode_weights == "run":
        given = _as_model(path_or_model)[0]
        model = infer_shapes(given)
        trim_value_info(model, value_info_names(given), DOMAIN)
        rename_dtype(model)
        _register(options, lib)
        return ort.InferenceSession(model.SerializeToString(), sess_options=options, **kwargs)
    loaded, folder = _as_model(path_or_model)
    prepared = session_model(loaded, lib, folder, int(options.intra_op_num_threads or 0))
    del loaded  # a file's model need not stay alive while onnxruntime loads the decoded one
    release_freed_memory()
    try:
        if prepared.custom_ops:
            _register(options, lib)
        elif os.environ.get("ONNXQ_ORT_ARENA") == "0":
            options.enable_cpu_mem_arena = False
        if prepared.memory_file is not None:
            name, data = prepared.memory_file
            options.add_external_initializers_from_files_in_memory([name], [data], [data.nbytes])
        return ort.InferenceSession(prepared.model, sess_options=options, **kwargs)
    finally:
        prepared.close()  # onnxruntime holds what it needs: its own copy, or the mapped file


def _register(options: Any, lib: str) -> None:
    options.register_custom_ops_library(lib)
    if os.environ.get("ONNXQ_ORT_ARENA") == "0":  # no arena: a sanitizer sees every overrun
        options.enable_cpu_mem_arena = False
