#!/usr/bin/env bash
# Installs what kvfleet needs to build and test, from Debian 12's packages.
# Idempotent: when everything is present it installs nothing and returns in a second.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config ccache git ca-certificates
  libzmq3-dev cppzmq-dev capnproto libcapnp-dev libboost1.81-dev prometheus-cpp-dev
  doctest-dev libxxhash-dev libpcre2-dev nlohmann-json3-dev libsimdjson-dev libcli11-dev libspdlog-dev
  libutf8proc-dev
  clang libclang-rt-14-dev
  prometheus gnuplot-nox curl python3 procps
  yamllint python3-yaml
  patchelf
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Node.js and npm (tokenizer references, the openai client tests): any install will do,
# Debian's packages or a vendor's nodejs that bundles npm.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "install-deps: not root and no sudo; install these packages: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
