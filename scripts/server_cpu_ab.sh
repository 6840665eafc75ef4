#!/usr/bin/env bash
# The API server process's CPU seconds per audio second (HTTP and orchestrator, not its stage replicas), two
# checkouts in alternating runs: the host's pace moves this figure by +-25% from one quarter hour to the next, so
# only runs side by side compare.
#
#   scripts/server_cpu_ab.sh BASE_TREE NEW_TREE [PAIRS=3] [PORT=8731]
#
# Each run starts `omnistage serve tiny` from its tree (PYTHONPATH=TREE, this checkout's interpreter), warms it
# (32 prompts at concurrency 16), then `bench serve --server-pid` at concurrency 64 (128 prompts, 48 tokens), and
# stops the server's process group. Prints every run and each pair's ratio NEW/BASE.
set -uo pipefail
BASE=$(realpath "$1"); NEW=$(realpath "$2"); PAIRS=${3:-3}; PORT=${4:-8731}
ROOT=$(realpath "$(dirname "$0")/..")
PY=${PYTHON:-$ROOT/.venv/bin/python}

run() {  # TREE -> prints the server's CPU s per audio s
    local tree=$1 log
    log=$(mktemp -t server-cpu-ab.XXXXXX)
    (cd "$tree" && exec setsid env PYTHONPATH="$tree" "$PY" -m omnistage.entrypoints.cli serve tiny --port "$PORT" \
        >"$log" 2>&1) &
    local pid=$!
    for _ in $(seq 240); do curl -s "localhost:$PORT/health" >/dev/null && break; sleep 1; done
    local bench=(env PYTHONPATH="$ROOT" "$PY" -m omnistage.entrypoints.cli bench serve --model tiny
                 --url "http://127.0.0.1:$PORT" --output-tokens 48 --no-progress)
    "${bench[@]}" --concurrency 16 --num-prompts 32 >/dev/null 2>&1
    "${bench[@]}" --server-pid "$pid" --concurrency 64 --num-prompts 128 2>&1 \
        | sed -n 's/.*server process: .*, \([0-9.]*\) per audio s.*/\1/p'
    kill -INT "$pid"; sleep 4; kill -9 -- "-$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    rm -f "$log"
}

for i in $(seq "$PAIRS"); do
    b=$(run "$BASE"); n=$(run "$NEW")
    echo "pair $i: base $b new $n ratio $(python3 -c "print(f'{$n / $b:.2f}')" 2>/dev/null || echo ?)"
done
