#!/usr/bin/env bash
# Installs the Debian packages Boulder's build and tests need. Idempotent; needs root (or sudo).
set -euo pipefail
PKGS=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libsqlite3-dev libyaml-cpp-dev
  libgtest-dev libgmock-dev libgloo-dev libopenblas-dev libcli11-dev
  prometheus tmux python3
  # The spec parser's fuzz target (clang's libFuzzer) and the tests' TLS certificates.
  clang libclang-rt-dev openssl
)
# kubectl renders the Kubernetes manifests in tests/deploy; a kubectl already installed is kept
# (kubernetes-client ships /usr/bin/kubectl too, and dpkg refuses to overwrite another package's).
command -v kubectl >/dev/null || PKGS+=(kubernetes-client)
# Node.js and npm run the deploy tests' schema validation (machines of this project's kind ship
# them outside dpkg; a plain Debian machine gets Debian's).
command -v npm >/dev/null || PKGS+=(nodejs npm)
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
