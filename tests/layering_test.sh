#!/usr/bin/env bash
# The rooms of the tree and what each may include. Routers and workers share only common/,
# schema/ (every wire contract) and, for the router, tokenizer/; inside the worker and the
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
  "worker/kv: common schema"
  "worker/model: common schema kernels"
  "worker/backend: common schema kernels worker/kv worker/model"
  "worker/engine: common schema worker/kv worker/model worker/backend"
  "worker/server: common common/http schema worker/kv worker/model worker/backend worker/engine"
  "worker: common common/http schema kernels worker/kv worker/model worker/backend worker/engine worker/server"
  # The router's rooms point one way: core (worker id, state, load, WorkerSignals) at the
  # bottom; index and fleet on it; events (a WorkerSignals, feeding the index) and routing
  # (the decision, over the fleet's loads and a PrefixIndex) above; http, then the binary.
  "router/core: common schema"
  "router/index: common schema router/core"
  "router/fleet: common schema router/core"
  "router/events: common schema router/core router/index"
  "router/routing: common schema router/core router/index router/fleet"
  "router/http: common common/http schema tokenizer router/core router/routing router/fleet"
  "router: common common/http schema tokenizer router/core router/index router/routing router/events router/fleet router/http"
  "cli: common common/http schema tokenizer worker/model cli"
)

# The room of a repository path: two levels under worker/, router/ and common/http, else one.
room_of() {
  local p="$1" top="${1%%/*}" rest="${1#*/}"
  case "$top" in
    worker|router)
      local second="${rest%%/*}"
      if [ "$second" != "$rest" ] && [ -d "$top/$second" ]; then echo "$top/$second"; else echo "$top"; fi ;;
    common)
      case "$rest" in http/*) echo "common/http" ;; *) echo "common" ;; esac ;;
    *) echo "$top" ;;
  esac
}

declare -A ALLOWED
for rule in "${RULES[@]}"; do
  room="${rule%%:*}"
  ALLOWED["$room"]=" $room ${rule#*:} "
done

violations=0
checked=0
while IFS= read -r file; do
  from="$(room_of "$file")"
  allowed="${ALLOWED[$from]:-}"
  if [ -z "$allowed" ]; then
    echo "layering: $file is in room '$from', which has no rule in tests/layering_test.sh"
    violations=$((violations + 1))
    continue
  fi
  while IFS= read -r inc; do
    checked=$((checked + 1))
    top="${inc%%/*}"
    # Only the project's own rooms; system and library headers are not ours to police.
    [ -e "$top" ] || [ "$top" = "schema" ] || continue
    [ -d "$top" ] || continue
    to="$(room_of "$inc")"
    case "$allowed" in *" $to "*) ;; *)
      echo "layering: $file includes \"$inc\": room '$from' may not include '$to'"
      violations=$((violations + 1)) ;;
    esac
  done < <(sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1/p' "$file" | grep '/')
done < <(git ls-files --cached --others --exclude-standard -- common schema kernels tokenizer worker router cli 2>/dev/null |
         grep -E '\.(h|cc|cu|cuh)$')

if [ "$checked" -eq 0 ]; then
  echo "layering: no includes checked (is $ROOT a kvfleet checkout?)"
  exit 1
fi
if [ "$violations" -ne 0 ]; then
  echo "layering: $violations include(s) cross the rooms' lines"
  exit 1
fi
echo "layering: $checked includes checked, none crosses the rooms' lines"
