#!/usr/bin/env bash
# The one test command: installs what the tests need when it is missing, then checks formatting,
# lints and runs every test of the workspace.
#
# Sourcing it (`source scripts/test.sh`) only defines its functions; tests/test_script.rs does
# that to check find_libclang against fake directory trees.

# Prints the libclang that bindgen (through clang-sys) would load, found under ROOT (default: /),
# and succeeds; fails printing nothing when there is none. clang-sys loads `libclang.so`,
# `libclang-NN.so`, `libclang.so.NN` or `libclang-NN.so.NN` from LLVM's and the multiarch library
# folders. `libclang-cpp.so.NN` is another library (the C++ API) that bindgen cannot use: it
# never counts. Runs in a subshell so that the glob option does not leak to the caller.
find_libclang() (
  root="${1:-}"
  shopt -s nullglob
  dirs=()
  if [ -z "$root" ] && [ -n "${LIBCLANG_PATH:-}" ]; then
    dirs+=("$LIBCLANG_PATH")
  fi
  if [ -z "$root" ] && command -v llvm-config >/dev/null 2>&1; then
    dirs+=("$(llvm-config --libdir)")
  fi
  dirs+=("$root"/usr/lib/llvm-*/lib "$root"/usr/lib/*-linux-gnu* "$root"/usr/lib64 \
    "$root"/usr/lib "$root"/usr/local/lib "$root"/usr/local/llvm*/lib)
  for dir in "${dirs[@]}"; do
    for file in "$dir"/libclang.so "$dir"/libclang-[0-9]*.so "$dir"/libclang.so.[0-9]* \
      "$dir"/libclang-[0-9]*.so.[0-9]*; do
      if [ -e "$file" ]; then
        echo "$file"
        exit 0
      fi
    done
  done
  exit 1
)

main() {
  set -euo pipefail
  cd "$(dirname "${BASH_SOURCE[0]}")/.."

  # System packages the tests use. Installed only when missing and only when we can (root + apt-get);
  # tests that need a missing tool say so in one line and are skipped (under CI=true they fail).
  need=()
  command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
  command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
  command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
  # ip (iproute2): the partition tests put etcd members and `vvm run` hosts in network namespaces.
  command -v ip >/dev/null 2>&1 || need+=(iproute2)
  # openssl: the etcd TLS test makes its certificate authority and certificates with it.
  command -v openssl >/dev/null 2>&1 || need+=(openssl)
  # postgresql: the PostgreSQL tests start servers of their own with Debian's initdb and postgres.
  if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
    need+=(postgresql)
  fi
  # libclang: the FoundationDB client crate generates its bindings at build time.
  if ! find_libclang >/dev/null; then
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

  # A CI run builds everything once from a clean clone: incremental compilation's caches would
  # only cost time and disk there. A developer's repeated runs keep them.
  if [ "${CI:-}" = true ]; then
    export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
  fi

  cargo fmt --all --check
  # `vvm/cli`: the host binary and the tests that run it (the library's default is lean).
  cargo clippy --workspace --all-targets --features vvm/cli -- -D warnings
  cargo test --workspace --features vvm/cli
  # The runtime without its `metrics` feature: the workspace build above unifies features and
  # turns it on, so the build without the hooks is compiled and linted only here.
  cargo clippy -p vvm-runtime --all-targets -- -D warnings
  # The documentation: a broken or ambiguous intra-doc link fails the run.
  RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --features vvm/cli

  # FoundationDB: its client library cannot be installed here, so the feature (store and tests) is
  # type-checked and linted (the store, its tests and the host binary's `fdb:` URLs); the live
  # conformance suite runs only against a cluster named by FDB_CLUSTER_FILE (with libfdb_c installed).
  # (etcd's TLS is built and tested with `cli`.)
  cargo clippy -p vvm -p vvm-adapters -p vvm-sequencer --no-default-features --features vvm/cli,vvm/foundationdb,vvm-adapters/foundationdb,vvm-sequencer/foundationdb --lib --tests --bins -- -D warnings
  if [ -n "${FDB_CLUSTER_FILE:-}" ]; then
    cargo test -p vvm-adapters --features foundationdb --test conformance_fdb
  else
    echo "skipped the FoundationDB conformance suite: FDB_CLUSTER_FILE is not set"
  fi
}

# Run only when executed, not when sourced: `return` succeeds only in a sourced file.
if ! (return 0 2>/dev/null); then
  main "$@"
fi
