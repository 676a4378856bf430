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
# libclang: the FoundationDB client crate generates its bindings at build time.
if [ -z "${LIBCLANG_PATH:-}" ] && ! ls /usr/lib/llvm-*/lib/libclang*.so* /usr/lib/*/libclang*.so* >/dev/null 2>&1; then
  need+=(libclang-dev)
fi
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

# FoundationDB: its client library cannot be installed here, so the feature (store and tests) is
# type-checked and linted (the store, its tests and the host binary's `fdb:` URLs), together with the
# etcd TLS feature that no other step builds; the live
# conformance suite runs only against a cluster named by FDB_CLUSTER_FILE (with libfdb_c installed).
cargo clippy -p vvm -p vvm-adapters --no-default-features --features vvm/cli,vvm/foundationdb,vvm-adapters/foundationdb,vvm-adapters/etcd-tls --tests --bins -- -D warnings
if [ -n "${FDB_CLUSTER_FILE:-}" ]; then
  cargo test -p vvm --no-default-features --features foundationdb --test conformance_fdb
else
  echo "skipped the FoundationDB conformance suite: FDB_CLUSTER_FILE is not set"
fi
