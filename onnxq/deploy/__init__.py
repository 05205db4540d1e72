"""Quantized weights in the layouts hardware reads.

`onnxq.deploy.export` writes a packed model's weights in their hardware layouts and reads them
back (`layouts` holds the layouts, `load` the reader); `onnxq.deploy.bfp` is the BFP document's
API (``onnxq.bfp``). Both write BFP's int8 layout with the one codec of `bfp_codec`.
"""
