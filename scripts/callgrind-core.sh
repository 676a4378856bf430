#!/usr/bin/env bash
# Instructions per event of the core machines, counted by callgrind (repeatable: instructions, not
# time). Reports, per machine, the inclusive cost of `handle` divided by the number of calls, and
# the whole workload per event (harness included) from two runs with N and 2N events.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p vvm-core --example core_events -q
bin=target/release/examples/core_events
n=${1:-60000}
run() { # machine events out-file
  valgrind --tool=callgrind --callgrind-out-file="$3" "$bin" "$1" "$2" >/dev/null 2>&1
}
total() { awk '/^summary:/ {print $2}' "$1"; }
for pair in "renewal Leadership::handle" "running Lifecycle::handle" "lifecycle Lifecycle::handle"; do
  set -- $pair
  a=$(mktemp); b=$(mktemp)
  run "$1" "$n" "$a"; run "$1" $((2 * n)) "$b"
  handle=$(callgrind_annotate --inclusive=yes "$b" 2>/dev/null | grep "$2" | head -1 | awk '{gsub(",","",$1); print $1}')
  events=$((2 * n)); [ "$1" = lifecycle ] && events=$((2 * n / 6 * 6))
  echo "$1: handle() $(( handle / events )) instructions/event; workload $(( ($(total "$b") - $(total "$a")) / n )) instructions/event"
  rm -f "$a" "$b"
done
