#!/usr/bin/env bash
# GPU checks of the Triton cast engine: the bit-exact tests on CUDA tensors, then the bandwidth
# benchmark, in under 8 minutes on one H100 including compilation. Needs torch + triton
# (torchao optional); no pip, no network.
# Usage (from the repository root): PYTHONPATH=. bash benchmarks/gpu_check.sh OUTDIR
# Writes to OUTDIR: env.txt, tests.log, tests.xml, bench.log, bench.json, results.md.
set -u
OUT="${1:?usage: benchmarks/gpu_check.sh OUTDIR}"
TEST_BUDGET="${GPU_CHECK_TEST_SECONDS:-240}"  # the tests, compilation included
TOTAL_BUDGET="${GPU_CHECK_TOTAL_SECONDS:-450}"  # the benchmark gets what the tests left
mkdir -p "$OUT"
export PYTHONPATH="${PYTHONPATH:-.}" PYTHONUNBUFFERED=1
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
TESTS=""
# The C library's kernels first: they compile nothing (built ahead of time) and have not run
# on a GPU since their last changes, so a run cut by the budget still checks them.
for t in tests/cast/triton/test_cuda_aot.py tests/cast/triton/test_fast.py \
         tests/cast/triton/test_engine.py tests/cast/triton/test_codebook.py \
         tests/cast/triton/test_search.py; do
  [ -f "$t" ] && TESTS="$TESTS $t"
done
# Kernel compilation dominates: with pytest-xdist, workers compile in parallel on the host's
# cores (the GPU is shared; each test compares with the reference on the CPU anyway).
WORKERS=""
if python3 -c "import xdist" 2>/dev/null; then
  WORKERS="-n ${GPU_CHECK_WORKERS:-8}"
fi
# -v streams one line per test, so a run cut by the timeout still shows what passed
timeout "$TEST_BUDGET" python3 -m pytest -v -p no:cacheprovider $WORKERS $TESTS \
  --junitxml="$OUT/tests.xml" --durations=15 -o addopts="" > "$OUT/tests.log" 2>&1
echo "pytest exit code: $? (124 = cut at ${TEST_BUDGET} s)" | tee -a "$OUT/tests.log"
grep -E "FAILED|ERROR" "$OUT/tests.log" | head -40
tail -25 "$OUT/tests.log"

echo "== benchmark =="
ELAPSED=$(( $(date +%s) - START ))
BUDGET=$(( TOTAL_BUDGET - ELAPSED - 30 ))
if [ "$BUDGET" -lt 40 ]; then BUDGET=40; fi
timeout $(( BUDGET + 60 )) python3 benchmarks/gpu.py --sweep --json "$OUT/bench.json" \
  --budget "$BUDGET" > "$OUT/bench.log" 2>&1
echo "benchmark exit code: $?" | tee -a "$OUT/bench.log"
tail -45 "$OUT/bench.log"
{
  echo "# GPU check $(date -u +%F)"
  echo
  sed 's/^/    /' "$OUT/env.txt"
  echo
  echo "Tests: $(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$OUT/tests.log" | tail -1)"
  echo
  python3 -c "import json, sys; sys.path.insert(0, 'benchmarks'); import gpu; print(gpu.summary(json.load(open('$OUT/bench.json'))))" 2>&1
  echo "Total seconds: $(( $(date +%s) - START ))"
} > "$OUT/results.md"
echo "total seconds: $(( $(date +%s) - START ))"
