#!/usr/bin/env bash
# Installs what is missing, builds, and starts a local fleet (router + workers).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
deploy/install-deps.sh
BUILD_DIR="$ROOT/build" deploy/build.sh
if ! build/cli/kvfleet --help 2>/dev/null | grep -q " up "; then
  echo "quickstart: built build/cli/kvfleet; 'kvfleet up' (router + workers) is not in this build yet."
  exit 0
fi
exec build/cli/kvfleet up
