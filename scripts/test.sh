#!/usr/bin/env bash
# The one test command: installs what the tests need when it is missing, then checks formatting,
# lints and runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages the tests use. Installed only when missing and only when we can (root + apt-get);
# tests that need a missing tool say so in one line and are skipped.
need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing: ${need[*]}"
    apt-get update -qq >/dev/null || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null || echo "could not install ${need[*]}"
  else
    echo "missing and not installable here: ${need[*]}"
  fi
fi

cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
