#!/usr/bin/env bash
# Dress rehearsal of scripts/gpu_check.sh on this CPU, so a missing wheel, a version skew or a path mistake is
# found here and not in the GPU window (issue 34; docs/gpu.md).
#   1. a throwaway virtualenv under /tmp (REHEARSAL_DIR) with the GPU image's versions (scripts/gpu_image.txt):
#      triton 3.6.0, transformers 5.17.0, tokenizers 0.23.2, safetensors, numpy, ... from PyPI through pip's
#      configured mirrors, and nothing else: it fails if the environment holds a package the image lacks
#      (scripts/gpu_image_packages.txt). The project is NOT installed into it: the import path is the repo root,
#      as on the GPU machine. Skew: torch. The image has 2.11.0+cu130; 2.11's CPU build is not obtainable here
#      (PyPI serves only a multi-GB CUDA build for x86-64), so the closest obtainable, 2.13.0 CPU from the local
#      disk, stands in. This machine's Python is 3.11 (the image's 3.12.3).
#   2. the carried wheels: the same packages and versions as `make gpu-wheels` (GPU_WHEELS in the Makefile), as
#      cp311 builds for this Python; installed by gpu_check.sh with the device notes' line (--target, PYTHONPATH).
#      When .whl/ exists its cp312 wheels are checked against the same list, and their size against the 64 MiB.
#   3. `gpu_check.sh --cpu` in it, under the same 480 s limit; every step must pass.
# The virtualenv is reused while scripts/gpu_image.txt is unchanged; --fresh rebuilds it.
set -euo pipefail
cd "$(dirname "$0")/.."
REH=${REHEARSAL_DIR:-/tmp/omnistage-gpu-rehearsal}
VENV=$REH/venv
START=$SECONDS
fail() { echo "gpu_rehearsal: FAILED: $*"; exit 1; }

if [[ ${1:-} == --fresh || ! -f $VENV/.built || scripts/gpu_image.txt -nt $VENV/.built ]]; then
  echo "=== building $VENV with the image's versions [$(date +%T)]"
  rm -rf "$VENV"
  mkdir -p "$REH"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch==2.13.0  # the CPU wheel on this machine's disk (pip's find-links)
  grep -v '^#' scripts/gpu_image.txt | xargs "$VENV/bin/pip" install -q 2>&1 | grep -v "^WARNING: Location" || true
  # typer (transformers' command line; never imported here) pulls pydantic in its newest release; the image has
  # typer without pydantic, so the environment drops what only that brought.
  "$VENV/bin/pip" uninstall -q -y pydantic pydantic-core annotated-types typing-inspection
  touch "$VENV/.built"
  echo "=== built in $((SECONDS - START)) s"
fi

# Nothing beyond the image's packages.
IMAGE=$(grep -v '^#' scripts/gpu_image_packages.txt | tr ' ' '\n' | grep .)
EXTRA=$("$VENV/bin/python" -m pip list --format=freeze 2>/dev/null | cut -d= -f1 | tr 'A-Z_.' 'a-z--' |
  grep -vxF -f <(echo "$IMAGE") || true)
[[ -z $EXTRA ]] || fail "the environment holds packages the GPU image lacks: $EXTRA"
"$VENV/bin/python" - <<'PY' || fail "the environment's versions are not the image's"
import importlib.metadata as md
want = {"triton": "3.6.0", "transformers": "5.17.0", "tokenizers": "0.23.2", "safetensors": "0.8.0"}
got = {name: md.version(name) for name in want}
print("=== versions:", got, "torch", md.version("torch"), "(image: 2.11.0+cu130)", "numpy", md.version("numpy"))
raise SystemExit(got != want)
PY

# The carried wheels: cp311 builds of what `make gpu-wheels` carries.
CARRIED=$(sed -n 's/^GPU_WHEELS := //p' Makefile)
[[ -n $CARRIED ]] || fail "no GPU_WHEELS line in the Makefile"
rm -rf "$REH/whl" "$REH/site" && mkdir -p "$REH/whl"
"$VENV/bin/pip" download -q --no-deps --only-binary=:all: -d "$REH/whl" $CARRIED 2>&1 | grep -v "^WARNING: Location" || true
if compgen -G ".whl/*.whl" >/dev/null; then  # what a device call would carry: the same names and versions
  for spec in $CARRIED; do
    name=${spec%%==*} version=${spec#*==}
    compgen -G ".whl/${name//-/_}-$version-*.whl" >/dev/null || fail ".whl/ lacks $spec (run make gpu-wheels)"
  done
  size=$(du -sm .whl | cut -f1)
  ((size < 32)) || fail ".whl/ is $size MiB; with the working tree it must stay within a call's 64 MiB"
fi
for m in msgspec zmq; do  # the image lacks these: only the carried wheels may bring them
  "$VENV/bin/python" -c "import $m" 2>/dev/null && fail "the environment itself imports $m; the image does not"
done

echo "=== gpu_check.sh --cpu in the image's environment [$(date +%T)]"
T0=$SECONDS
rc=0
env -u PYTHONPATH PYTHON="$VENV/bin/python" WHEELS="$REH/whl" SITE="$REH/site" OUT="$REH/out" \
  timeout -k 10 480 scripts/gpu_check.sh --cpu || rc=$?
CHECK_S=$((SECONDS - T0))
((rc == 0)) || fail "gpu_check.sh --cpu exited $rc after $CHECK_S s (log: $REH/out/gpu_check.log)"
"$VENV/bin/python" - "$REH/out/gpu_check.json" <<'PY' || fail "the JSON is incomplete ($REH/out/gpu_check.json)"
import json, sys
report = json.load(open(sys.argv[1]))
steps = report["steps"]
want = ["smoke", "parity", "measure", "device", "thinker", "talker"]
bad = {n: steps.get(n, {}).get("status") for n in want if steps.get(n, {}).get("status") != "ok"}
print("=== steps:", {n: (steps[n]["status"], steps[n]["seconds"], steps[n]["budget_s"]) for n in want if n in steps})
assert not bad, bad
assert report["smoke"]["versions"]["transformers"] == "5.17.0" and report["smoke"]["versions"]["msgspec"]
PY
echo "gpu_rehearsal: PASSED: gpu_check.sh --cpu ran in $CHECK_S s (limit 480); whole rehearsal $((SECONDS - START)) s"
