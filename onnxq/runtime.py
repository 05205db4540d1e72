"""onnxruntime sessions with the onnxq custom ops (QuantizeMX, DequantizeMX, CodebookLookup).

`library_path` gives the custom-op library for any onnxruntime host
(``SessionOptions.register_custom_ops_library``); `session` builds a ready
``onnxruntime.InferenceSession``. They live in `onnxq.graph.ort_session`, below both this
module and calibration, which needs a session too.
"""

from onnxq.graph.ort_session import has_custom_ops, library_path, session

__all__ = ["has_custom_ops", "library_path", "session"]
