#!/usr/bin/env bash
# run.sh SCRIPT ROUTER_BIN WORKER_BIN WORK_DIR BASE_PORT [KVFLEET_BIN]: runs one Node integration
# script; KVFLEET_BIN (the CLI, "missing" when not built) is its fifth argument.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
script="$1"; router="$2"; worker="$3"; dir="$4"; port="$5"; cli="${6:-missing}"
# Other fleets may run on this machine: offset the base port by this process's id, staying
# below the kernel's ephemeral range (32768 and up), where outgoing connections take ports.
port=$((port + ($$ % 10) * 30))
if [ "$worker" = missing ] || [ ! -x "$worker" ]; then echo "SKIP: kvfleet-worker is not built"; exit 77; fi
command -v node >/dev/null || { echo "SKIP: node is missing"; exit 77; }
cache="${KVFLEET_CACHE:-$HOME/.cache/kvfleet}"
if { [ "$script" = openai_client_test.mjs ] || [ "$script" = openai_api_test.mjs ]; } && [ ! -f "$cache/npm/node_modules/openai/package.json" ]; then
  echo "SKIP: the openai npm package is missing (run tests/assets.sh)"; exit 77
fi
rm -rf "$dir"; mkdir -p "$dir"
node "$here/$script" "$router" "$worker" "$dir" "$port" "$cli"
rc=$?
# Logs sit in the work directory or, for scripts that start one fleet per case, one level down.
if [ $rc -ne 0 ]; then
  find "$dir" -maxdepth 2 -name '*.log' | sort | while read -r f; do echo "== $f"; tail -20 "$f"; done
fi
exit $rc
