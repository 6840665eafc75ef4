#!/usr/bin/env bash
# The serve path as a newcomer meets it: a fresh virtualenv, `pip install .` with no extras, `omnistage serve
# tiny`, then a chat completion with audio, a realtime WebSocket turn and /docs with its assets
# (scripts/fresh_install_client.py). The test suite runs in a venv with the test extra, which once hid a
# runtime dependency (httpx) that only the extra pulled in; this check installs what a user installs.
#
#   scripts/fresh_install_check.sh          # PYTHON=python3.12 to pick the interpreter
#
# Bounded by FRESH_INSTALL_BUDGET_S (default 600 s; it took 90-116 s on a busy 2-core machine with wheels on
# local disk: 25-35 s torch, 40-50 s the rest, 16-21 s to make the tiny checkpoint and start, 3 s of requests).
# The package is copied (tracked and untracked, not ignored, files) so the build leaves nothing in the tree,
# and the tiny checkpoint is made in the temporary folder too. Prints one PASS/FAIL line; exits 1 on failure.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
BUDGET_S=${FRESH_INSTALL_BUDGET_S:-600}
MODEL=tiny
WORK=$(mktemp -d -t omnistage-fresh.XXXXXX)
SERVER_PID=""

step() { echo "[fresh install ${SECONDS}s] $*"; }

left() {  # seconds of the budget left (at least 1, so `timeout` still runs and fails fast)
  local n=$((BUDGET_S - SECONDS))
  echo $((n > 0 ? n : 1))
}

stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  # The server was started in its own session: its group holds the stage processes it spawned too.
  kill -TERM -- "-$SERVER_PID" 2>/dev/null
  for _ in $(seq 1 20); do
    kill -0 -- "-$SERVER_PID" 2>/dev/null || break
    sleep 0.5
  done
  kill -KILL -- "-$SERVER_PID" 2>/dev/null
  SERVER_PID=""
}

cleanup() {
  stop_server
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bounded() {  # bounded WHAT LOG CMD...: CMD under the budget left (its output to LOG, - for ours), else fail
  local what=$1 log=$2 rc
  shift 2
  if [ "$log" = - ]; then
    timeout "$(left)" "$@"
  else
    timeout "$(left)" "$@" >>"$log" 2>&1
  fi
  rc=$?
  [ "$rc" -eq 124 ] && fail "$what: over the ${BUDGET_S}s budget"
  [ "$rc" -eq 0 ] || fail "$what: exit $rc"
}

fail() {
  echo "fresh install check: FAIL ($1) after ${SECONDS}s"
  if [ -s "$WORK/server.log" ]; then  # the server's log, else pip's
    echo "--- last lines of the server's log ---"
    tail -n 40 "$WORK/server.log"
  elif [ -s "$WORK/pip.log" ]; then
    echo "--- last lines of pip's output ---"
    tail -n 40 "$WORK/pip.log"
  fi
  exit 1
}

step "fresh virtualenv in $WORK with $PYTHON"
"$PYTHON" -m venv "$WORK/venv" || fail "python -m venv"
PIP=("$WORK/venv/bin/python" -m pip --disable-pip-version-check)

# torch first and pinned: the CPU wheel lies on local disk; an open range would pull a multi-GB CUDA build.
step "pip install torch==2.13.0"
bounded "pip install torch==2.13.0" "$WORK/pip.log" "${PIP[@]}" install -q torch==2.13.0

step "pip install . (no extras)"
mkdir "$WORK/src"
git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
  | xargs -0 cp --parents -t "$WORK/src" || fail "copying the source tree"
bounded "pip install ." "$WORK/pip.log" "${PIP[@]}" install -q "$WORK/src"

PORT=$("$WORK/venv/bin/python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
# Positional MODEL, as vLLM's `serve MODEL` (the same as --model tiny).
step "omnistage serve $MODEL --port $PORT"
(cd "$WORK" && OMNISTAGE_CACHE="$WORK/cache" exec setsid "$WORK/venv/bin/omnistage" serve "$MODEL" \
  --port "$PORT" >"$WORK/server.log" 2>&1) &
SERVER_PID=$!

until curl -sf -o /dev/null "http://127.0.0.1:$PORT/health"; do
  kill -0 "$SERVER_PID" 2>/dev/null || fail "the server exited before /health answered"
  [ "$(left)" -gt 1 ] || fail "/health did not answer within the budget"
  sleep 1
done
step "/health answers"

bounded "a client check" - "$WORK/venv/bin/python" "$ROOT/scripts/fresh_install_client.py" \
  "http://127.0.0.1:$PORT" "$MODEL"
stop_server
echo "fresh install check: PASS in ${SECONDS}s (pip install torch + ., serve $MODEL, chat audio, realtime, /docs)"
