#!/usr/bin/env bash
# The API server process's CPU seconds per audio second (HTTP and orchestrator, not its stage replicas), two
# checkouts compared: the host's pace moves this figure by +-25% from one quarter hour to the next, so only runs
# side by side compare.
#
#   scripts/server_cpu_ab.sh BASE_TREE NEW_TREE [PAIRS=3] [PORT=8731]
#
# Each run starts `omnistage serve tiny` from its tree (PYTHONPATH=TREE, this checkout's interpreter, the extra
# flags in $BASE_ARGS / $NEW_ARGS), warms it (32 prompts at concurrency 16), then `bench serve --server-pid` at
# concurrency 64 (128 prompts, 48 tokens), and stops the server's process group. Prints every pair's ratio NEW/BASE.
# By default the two run in turn; with SIDE_BY_SIDE=1 both servers and both benches run at once (on PORT and
# PORT+1), so whatever else loads the host loads both alike (a loaded host's figures, in turn, drift between them).
set -uo pipefail
BASE=$(realpath "$1"); NEW=$(realpath "$2"); PAIRS=${3:-3}; PORT=${4:-8731}
ROOT=$(realpath "$(dirname "$0")/..")
PY=${PYTHON:-$ROOT/.venv/bin/python}

serve() {  # TREE PORT ARGS -> the server's pid
    (cd "$1" && exec setsid env PYTHONPATH="$1" "$PY" -m omnistage.entrypoints.cli serve tiny --port "$2" $3 \
        >/dev/null 2>&1) &
    echo $!
}

measure() {  # PORT PID -> prints the server's CPU s per audio s
    local bench=(env PYTHONPATH="$ROOT" "$PY" -m omnistage.entrypoints.cli bench serve --model tiny
                 --url "http://127.0.0.1:$1" --output-tokens 48 --no-progress)
    for _ in $(seq 240); do curl -s "localhost:$1/health" >/dev/null && break; sleep 1; done
    "${bench[@]}" --concurrency 16 --num-prompts 32 >/dev/null 2>&1
    "${bench[@]}" --server-pid "$2" --concurrency 64 --num-prompts 128 2>&1 \
        | sed -n 's/.*server process: .*, \([0-9.]*\) per audio s.*/\1/p'
}

stop() {  # PID...
    kill -INT "$@" 2>/dev/null; sleep 4
    for pid in "$@"; do kill -9 -- "-$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
}

for i in $(seq "$PAIRS"); do
    if [ "${SIDE_BY_SIDE:-0}" = 1 ]; then
        bp=$(serve "$BASE" "$PORT" "${BASE_ARGS:-}"); np=$(serve "$NEW" $((PORT + 1)) "${NEW_ARGS:-}")
        out=$(mktemp -t server-cpu-ab.XXXXXX)
        measure "$PORT" "$bp" >"$out" & waiter=$!
        n=$(measure $((PORT + 1)) "$np"); wait "$waiter"; b=$(cat "$out"); rm -f "$out"
        stop "$bp" "$np"
    else
        bp=$(serve "$BASE" "$PORT" "${BASE_ARGS:-}"); b=$(measure "$PORT" "$bp"); stop "$bp"
        np=$(serve "$NEW" "$PORT" "${NEW_ARGS:-}"); n=$(measure "$PORT" "$np"); stop "$np"
    fi
    echo "pair $i: base $b new $n ratio $(python3 -c "print(f'{$n / $b:.2f}')" 2>/dev/null || echo ?)"
done
