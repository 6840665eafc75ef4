#!/usr/bin/env bash
# CUDA graphs vs eager for the thinker decoder at Qwen3-Omni-30B-A3B sizes (random weights) on one GPU:
# parity, decode step ms at batch 1 and 16 with/without graphs, and the HBM-bandwidth bound. < 8 minutes.
# Without CUDA it says so and exits 0. Extra arguments go to scripts/gpu_check.py (--tiny, --layers N, --json F).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  if [[ " $* " != *" --tiny "* ]]; then
    echo "gpu_check: CUDA is not available on this machine; nothing to check (try: $0 --tiny for a CPU sanity run)"
    exit 0
  fi
fi
exec timeout 480 "$PY" scripts/gpu_check.py "$@"
