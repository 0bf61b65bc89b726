#!/usr/bin/env bash
# The rooms of the tree and what each may include. Routers and workers share only common/,
# schema/ (every wire contract), grammar/ (structured outputs) and, for the router, tokenizer/; inside the worker and the
# router, each layer includes only the layers below it. A new include that crosses these lines fails here.
#
#   tests/layering_test.sh [ROOT]
set -uo pipefail
ROOT="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$ROOT"

# room: the rooms (besides itself) whose headers it may include.
RULES=(
  "common: "
  "common/http: common"
  "schema: common"
  "kernels: common"
  "tokenizer: common"
  # Constrained decoding (structured outputs): the router validates specs, the worker masks.
  "grammar: common"
  "worker/kv: common schema"
  "worker/model: common schema kernels"
  "worker/backend: common schema kernels grammar worker/kv worker/model"
  "worker/engine: common schema grammar worker/kv worker/model worker/backend"
  # KV transfer between workers (Contract 4): the wire and its sockets, no cache of its own.
  "worker/transfer: common schema"
  "worker/server: common common/http schema worker/kv worker/model worker/backend worker/engine worker/transfer"
  "worker: common common/http schema kernels grammar worker/kv worker/model worker/backend worker/engine worker/transfer worker/server"
  # The router's rooms point one way: core (worker id, state, load, WorkerSignals) at the
  # bottom; index and fleet on it; events (a WorkerSignals, feeding the index) and routing
  # (the decision, over the fleet's loads and a PrefixIndex) above; http, then the binary.
  "router/core: common schema"
  "router/index: common schema router/core"
  "router/fleet: common schema router/core"
  "router/events: common schema router/core router/index"
  "router/routing: common schema router/core router/index router/fleet"
  "router/http: common common/http schema tokenizer grammar router/core router/routing router/fleet"
  "router: common common/http schema tokenizer grammar router/core router/index router/routing router/events router/fleet router/http"
  "cli: common common/http schema tokenizer worker/model cli"
)

# The room of a repository path, into ROOM: two levels under worker/, router/ and common/http,
# else one. It sets a variable rather than printing, so the loops below fork nothing per include.
room_of() {
  local top="${1%%/*}" rest="${1#*/}"
  case "$top" in
    worker|router)
      local second="${rest%%/*}"
      if [ "$second" != "$rest" ] && [ -d "$top/$second" ]; then ROOM="$top/$second"; else ROOM="$top"; fi ;;
    common)
      case "$rest" in http/*) ROOM="common/http" ;; *) ROOM="common" ;; esac ;;
    *) ROOM="$top" ;;
  esac
}

declare -A ALLOWED
for rule in "${RULES[@]}"; do
  room="${rule%%:*}"
  ALLOWED["$room"]=" $room ${rule#*:} "
done

violations=0
checked=0
mapfile -t FILES < <(git ls-files --cached --others --exclude-standard -- common schema kernels tokenizer grammar worker router cli 2>/dev/null |
                     grep -E '\.(h|cc|cu|cuh)$')
declare -A FILE_ROOM
for file in "${FILES[@]}"; do
  room_of "$file"
  FILE_ROOM["$file"]="$ROOM"
  if [ -z "${ALLOWED[$ROOM]:-}" ]; then
    echo "layering: $file is in room '$ROOM', which has no rule in tests/layering_test.sh"
    violations=$((violations + 1))
  fi
done
# Every quoted include with a folder in it, as "file:path", in one pass over the files.
while IFS= read -r line; do
  file="${line%%:*}"
  inc="${line#*:}"
  from="${FILE_ROOM[$file]}"
  allowed="${ALLOWED[$from]:-}"
  [ -n "$allowed" ] || continue
  checked=$((checked + 1))
  top="${inc%%/*}"
  # Only the project's own rooms; system and library headers are not ours to police.
  [ -d "$top" ] || continue
  room_of "$inc"
  case "$allowed" in *" $ROOM "*) ;; *)
    echo "layering: $file includes \"$inc\": room '$from' may not include '$ROOM'"
    violations=$((violations + 1)) ;;
  esac
done < <([ ${#FILES[@]} -eq 0 ] || grep -HE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[^"]*/[^"]*"' "${FILES[@]}" |
         sed -nE 's/^([^:]+):[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1:\2/p')

if [ "$checked" -eq 0 ]; then
  echo "layering: no includes checked (is $ROOT a kvfleet checkout?)"
  exit 1
fi
if [ "$violations" -ne 0 ]; then
  echo "layering: $violations include(s) cross the rooms' lines"
  exit 1
fi
echo "layering: $checked includes checked, none crosses the rooms' lines"
