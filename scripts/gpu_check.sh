#!/usr/bin/env bash
# One H200 check of the CUDA paths, in ≤ 480 s of wall time including its own set-up (docs/gpu.md has the
# budget table; docs/architecture.md, "Decode at the memory floor", what is measured):
#   0. set-up: installs the carried wheels of what the image lacks (`make gpu-wheels` puts them in .whl/; carry
#      `.whl`), puts the repo root on the import path, records versions and nvidia-smi's line;
#   1. smoke (20 s): imports, a tiny decoder's forward on CUDA through the runner (Triton paged attention and
#      fused MoE, one decode CUDA graph captured), one Triton kernel against torch. Stops the run if it fails;
#   2. kernel parity in bf16 at real widths (fused MoE, paged attention, int8 linear) against the torch paths;
#   3. measure: one process builds the thinker decoder (48 layers, real widths) and then the talker (20 layers +
#      code predictor) from random weights on the GPU, no checkpoint: CUDA graphs vs eager, decode step times and
#      roofline figures at batch 1 and 16, whether every graph set was captured.
# Everything is teed into $OUT/gpu_check.log; the figures go to ONE JSON, $OUT/gpu_check.json, updated after each
# step (a killed step still leaves the log and a partial JSON). Nothing else is written under $OUT.
# Without CUDA it says so and exits 0. --cpu runs the same steps on the CPU at toy sizes (Triton interpreted,
# fp32, no graphs) to check the script itself; it needs no pytest (parity runs in-process).
# Environment: PYTHON (default python3, or .venv/bin/python where it exists), OUT (default gpu_check_out),
# WHEELS (default .whl: a folder of wheels to install with --target into SITE, default /tmp/site).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-gpu_check_out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
MODE=cuda
[[ "${1:-}" == "--cpu" ]] && MODE=cpu
PY=${PYTHON:-python3}
[[ -z ${PYTHON:-} && -x .venv/bin/python ]] && PY=.venv/bin/python
JSON="$OUT/gpu_check.json"
rm -f "$JSON"
START=$SECONDS
# Step budgets in seconds (docs/gpu.md's table): set-up 15, smoke 20, parity 60, measure 330 (its sub-steps:
# device rates 10, thinker 170, talker 140, plus start-up) = 425, under the 480 s the whole run may take.
SETUP_S=15 SMOKE_S=20 PARITY_S=60 MEASURE_S=330

echo "=== gpu_check $MODE [$(date +%T)] python: $PY"
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/site}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  timeout "$SETUP_S" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl || { echo "gpu_check: STOPPED: the carried wheels in $WHEELS did not install"; exit 1; }
  export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  echo "=== installed $(ls "$WHEELS" | tr '\n' ' ')into $SITE"
else
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  echo "=== no wheels in $WHEELS (make gpu-wheels, and carry .whl): using what $PY has"
fi
export PYTHONUNBUFFERED=1
CPU_FLAG=()
if [[ $MODE == cpu ]]; then
  export TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES=""
  CPU_FLAG=(--cpu)
elif ! timeout "$SETUP_S" "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: CUDA is not available on this machine; nothing to check (try: $0 --cpu)"
  exit 0
fi
[[ $MODE == cuda ]] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

FAILED=()
step() {  # step NAME SECONDS COMMAND...: the command within its budget; its status recorded in the JSON
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  echo "=== $name (budget ${limit}s) [$(date +%T)]"
  timeout -k 5 "$limit" "$@"
  rc=$?
  "$PY" scripts/gpu_report.py "$JSON" step "$name" "$rc" "$((SECONDS - t0))" "$limit"
  if ((rc != 0)); then FAILED+=("$name"); echo "=== $name FAILED (exit $rc) after $((SECONDS - t0)) s"; fi
  return $rc
}
CHECK=("$PY" scripts/gpu_check.py "${CPU_FLAG[@]}" --json "$JSON")
if ! step smoke "$SMOKE_S" "${CHECK[@]}" smoke --budget $((SMOKE_S - 5)); then
  echo "gpu_check: STOPPED: the smoke step failed, so the rest would too; see $OUT/gpu_check.log (steps.smoke in $JSON)"
  exit 1
fi
step parity "$PARITY_S" "${CHECK[@]}" parity --budget $((PARITY_S - 5))
step measure "$MEASURE_S" "${CHECK[@]}" measure
"$PY" scripts/gpu_report.py "$JSON" set wall_s "$((SECONDS - START))"
echo "gpu_check: done in $((SECONDS - START)) s (budget 480); figures in $JSON, log in $OUT/gpu_check.log"
if ((${#FAILED[@]})); then
  echo "gpu_check: FAILED: ${FAILED[*]}"
  exit 1
fi
