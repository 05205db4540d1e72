#!/usr/bin/env bash
# GPU checks of the Triton cast engine (issue 5): the bit-exact tests on CUDA tensors, then the
# bandwidth benchmark. Needs torch + triton (torchao optional); no pip, no network.
# Usage (from the repository root): PYTHONPATH=. bash benchmarks/gpu_check.sh OUTDIR
# Budget: under 5 minutes on one H100 (tests <= 170 s, benchmark <= 110 s of cases).
set -u
OUT="${1:?usage: benchmarks/gpu_check.sh OUTDIR}"
mkdir -p "$OUT"
export PYTHONPATH="${PYTHONPATH:-.}"
unset TRITON_INTERPRET
START=$(date +%s)
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, 'cuda', torch.cuda.is_available())"
  python3 -c "import torchao; print('torchao', torchao.__version__)" 2>&1 | tail -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

echo "== tests (GPU path) =="
# -v streams one line per test, so a run cut by the timeout still shows what passed
timeout 170 python3 -m pytest -v -p no:cacheprovider tests/test_triton.py \
  --junitxml="$OUT/tests.xml" --durations=15 -o addopts="" > "$OUT/tests.log" 2>&1
echo "pytest exit code: $?" | tee -a "$OUT/tests.log"
grep -E "FAILED|ERROR" "$OUT/tests.log" | head -40
tail -25 "$OUT/tests.log"

echo "== benchmark =="
ELAPSED=$(( $(date +%s) - START ))
BUDGET=$(( 250 - ELAPSED ))
if [ "$BUDGET" -lt 30 ]; then BUDGET=30; fi
timeout $(( BUDGET + 40 )) python3 benchmarks/gpu.py --json "$OUT/bench.json" --budget "$BUDGET" \
  > "$OUT/bench.log" 2>&1
echo "benchmark exit code: $?" | tee -a "$OUT/bench.log"
tail -40 "$OUT/bench.log"
echo "total seconds: $(( $(date +%s) - START ))" | tee "$OUT/total.txt"
