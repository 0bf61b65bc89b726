#!/usr/bin/env bash
# Builds every libFuzzer target with clang into build-fuzz and runs each one for
# KVFLEET_FUZZ_SECONDS (default 20) from its seed corpus (tests/fuzz/corpus/<name>/).
# A crash, leak or sanitizer report fails the run and leaves the input in build-fuzz/crashes/.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SECONDS_EACH="${KVFLEET_FUZZ_SECONDS:-20}"
DIR="$ROOT/build-fuzz"
CC=clang CXX=clang++ BUILD_DIR="$DIR" BUILD_TARGET=kvfleet_fuzzers "$ROOT/deploy/build.sh" \
  -DKVFLEET_FUZZ=ON -DKVFLEET_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=${SAN_OPT_FLAGS:--O1 -g1 -DNDEBUG}" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=${SAN_OPT_FLAGS:--O1 -g1 -DNDEBUG}" || { echo "fuzz: build failed"; exit 1; }
shopt -s nullglob
fuzzers=("$DIR"/fuzzers/*)
if [ ${#fuzzers[@]} -eq 0 ]; then echo "fuzz: no fuzz targets in this build"; exit 0; fi
mkdir -p "$DIR/crashes"
rc=0
for f in "${fuzzers[@]}"; do
  name="$(basename "$f")"
  work="$DIR/corpus-work/$name"; mkdir -p "$work"
  seeds=()
  [ -d "$ROOT/tests/fuzz/corpus/$name" ] && seeds+=("$ROOT/tests/fuzz/corpus/$name")
  echo "fuzz: $name for ${SECONDS_EACH}s"
  if ! "$f" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$DIR/crashes/$name-" "$work" "${seeds[@]}" >"$DIR/$name.log" 2>&1; then
    echo "fuzz: $name FAILED"; tail -40 "$DIR/$name.log"; rc=1
  else
    grep -aE "stat::number_of_executed_units" "$DIR/$name.log" | sed "s/^/fuzz: $name /"
  fi
done
exit $rc
