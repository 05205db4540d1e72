"""The ONNX side: op schemas, standard-ONNX function fallbacks, graph passes.

Importing this package registers the ONNX schemas of the onnxq ops (`schemas.register_schemas`).
"""

from onnxq.graph.schemas import DOMAIN, OPS, VERSION, register_schemas

register_schemas()

__all__ = ["DOMAIN", "OPS", "VERSION", "register_schemas"]
