"""The model `onnxq.graph.load_decode.session_model` hands onnxruntime, read back for tests."""

from __future__ import annotations

from pathlib import Path

import onnx

from onnxq.graph.load_decode import session_model
from onnxq.graph.ort_session import library_path


def handed_model(model: onnx.ModelProto, load_external_data: bool = False) -> onnx.ModelProto:
    """The session model of ``model`` (external data from the working directory), loaded
    before its temporary folder is removed."""
    given = session_model(model, library_path(), Path.cwd())
    try:
        if isinstance(given.model, bytes):
            return onnx.load_from_string(given.model)
        return onnx.load(str(given.model), load_external_data=load_external_data)
    finally:
        given.close()
