#!/usr/bin/env bash
# One-GPU check of the decode path, under 10 minutes (docs/architecture.md, "Decode at the memory floor"):
#   1. roofline at the real Qwen3-Omni-30B-A3B widths: `bench roofline` on the slice checkpoint (made here if
#      absent), thinker and talker, batch 1 and 16, bf16, CUDA graphs: step ms, bytes, HBM copy bandwidth;
#   2. kernel parity vs the torch paths: the fused MoE and paged-attention Triton kernels, CUDA graphs
#      (pytest -m gpu);
#   3. CUDA graphs vs eager for the thinker decoder at real widths (scripts/gpu_check.py);
#   4. FP8 vs bf16 thinker decode at real widths: the slice checkpoint rewritten in ModelOpt FP8
#      (`make-tiny --fp8`), `bench roofline` on it (FP8 GEMMs via torch._scaled_mm on 8.9+ GPUs, the fused MoE
#      kernel on FP8 experts) against step 1's bf16 thinker figures; and int8 weight-only vs bf16 (`bench quant`).
# Figures go to $OUT (default gpu_check_out/) as JSON. Without CUDA it says so and exits 0.
# --cpu runs the same entry points on CPU at toy sizes (Triton interpreted) to check the script itself.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
MODE=cuda
[[ "${1:-}" == "--cpu" ]] && MODE=cpu
if [[ $MODE == cuda ]] && ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: CUDA is not available on this machine; nothing to check (try: $0 --cpu)"
  exit 0
fi
# The kernel-parity step needs the test extra: pytest (pytest-timeout for pyproject's `timeout`) and Triton.
MISSING=$("$PY" -c 'import importlib.util as u
print(*(m for m in ("pytest", "pytest_timeout", "triton") if u.find_spec(m) is None))') || MISSING="(python failed)"
if [[ -n $MISSING ]]; then
  echo "gpu_check: $PY cannot import $MISSING (the test extra): run make install-test or pip install -e '.[test]'"
  exit 2
fi
OMNI=("$PY" -m omnistage.entrypoints.cli)
if [[ $MODE == cuda ]]; then
  MODEL=slice; DEVICE=cuda; DTYPE=bfloat16; THREADS=4; PARITY=(-m gpu); GRAPHS=(--layers 24)
else
  MODEL=tiny; DEVICE=cpu; DTYPE=float32; THREADS=1; PARITY=(-k "triton or in_place or gathered"); GRAPHS=(--tiny)
fi
FAILED=()

step() {  # step NAME SECONDS COMMAND...: runs with a time limit, records a failure, goes on
  local name=$1 limit=$2
  shift 2
  echo "=== $name (limit ${limit}s) [$(date +%T)]"
  if ! timeout "$limit" "$@"; then FAILED+=("$name"); echo "=== $name FAILED"; fi
}

START=$SECONDS
step "make the $MODEL checkpoint" 120 "${OMNI[@]}" make-tiny --size "$MODEL" --cached
for stage in thinker talker; do
  step "roofline $stage" 80 "${OMNI[@]}" bench roofline --model "$MODEL" --stage "$stage" --batch 1,16 \
    --device "$DEVICE" --dtype "$DTYPE" --threads "$THREADS" --steps 10 --json "$OUT/roofline_$stage.json"
done
step "kernel parity" 60 "$PY" -m pytest -q -p no:cacheprovider "${PARITY[@]}" \
  tests/layers/test_moe_paths.py tests/layers/test_paged_attention.py tests/runner/test_cuda_graph.py
step "CUDA graphs vs eager" 120 "$PY" scripts/gpu_check.py "${GRAPHS[@]}" --json "$OUT/graphs.json"
FP8_DIR="$OUT/${MODEL}_fp8"
step "make the FP8 $MODEL checkpoint" 120 "${OMNI[@]}" make-tiny --size "$MODEL" --fp8 "$FP8_DIR"
step "roofline thinker FP8" 80 "${OMNI[@]}" bench roofline --model "$FP8_DIR" --stage thinker --batch 1,16 \
  --device "$DEVICE" --dtype "$DTYPE" --threads "$THREADS" --steps 10 --json "$OUT/roofline_thinker_fp8.json"
step "int8 vs $DTYPE thinker" 80 "${OMNI[@]}" bench quant --model "$MODEL" --quantization int8 --output-len 64 \
  --device "$DEVICE" --dtype "$DTYPE" --threads "$THREADS" --json "$OUT/quant_int8.json"
rm -rf "$FP8_DIR"
echo "gpu_check: done in $((SECONDS - START)) s; figures in $OUT/"
if ((${#FAILED[@]})); then
  echo "gpu_check: FAILED: ${FAILED[*]}"
  exit 1
fi
