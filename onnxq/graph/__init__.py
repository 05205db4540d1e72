"""The ONNX side: op schemas, standard-ONNX function fallbacks, graph passes.

The ONNX schemas of the onnxq ops are registered when first needed (`register_schemas`, called
by `infer_shapes`, `onnxq.runtime.session` and `quantize_model`), not at import.
"""

from onnxq.graph.schemas import DOMAIN, OPS, VERSION, infer_shapes, register_schemas

__all__ = ["DOMAIN", "OPS", "VERSION", "infer_shapes", "register_schemas"]
