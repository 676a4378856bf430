#!/usr/bin/env bash
# Graceful hand-off on SQLite between two real `vvm run` processes: the time from SIGTERM of
# the holder to the line `leading ...` of the waiting candidate (whose services have started).
#
#   scripts/handoff-sqlite.sh [VVM_BINARY] [RUNS] [ROUND]
#
# Defaults: target/release/vvm, 20 runs, rounds of 1s (the default of `vvm run`), lease 2s.
# Prints one figure per run, then median, p90, p99 and max in milliseconds. The candidate wakes
# from the store's change feed (the deletion, or the holder's slot lock let go), not a round.
# Failover without a release (SIGKILL, SIGSTOP) is measured by `cargo bench --bench
# failover_sqlite`.
set -euo pipefail

bin=${1:-target/release/vvm}
runs=${2:-20}
round=${3:-1s}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# Runs `vvm run` as $1 on the store, stamping each line of its standard output with the time
# it was read ($EPOCHREALTIME, microseconds, no fork); the stamped lines go to $work/$1.log.
start() {
    local name=$1
    ( "$bin" run --store "sqlite:$work/leases.sqlite" --slots 1 --address "$name" \
        --lease 2s --round "$round" --acquire 120s --log-level warn 2>>"$work/$name.err" \
      | while IFS= read -r line; do echo "$EPOCHREALTIME $line"; done >"$work/$name.log" ) &
}

# Waits (at most 10 s) for $1 to print `leading`; echoes the stamp of that line.
leading_at() {
    local name=$1
    for _ in $(seq 1000); do
        if grep -q " leading " "$work/$name.log" 2>/dev/null; then
            grep -m1 " leading " "$work/$name.log" | cut -d' ' -f1
            return 0
        fi
        sleep 0.01
    done
    echo "no leader: $name" >&2
    return 1
}

pid_of() { pgrep -f -- "--address $1 " | head -1; }

figures=()
for run in $(seq "$runs"); do
    rm -f "$work"/*
    start "holder-$run"
    leading_at "holder-$run" >/dev/null
    start "candidate-$run"
    # The candidate is refused and waits for its next round; stop the holder somewhere in it.
    sleep "0.$((RANDOM % 9 + 1))"
    holder=$(pid_of "holder-$run")
    term_at=$EPOCHREALTIME
    kill -TERM "$holder"
    led_at=$(leading_at "candidate-$run")
    ms=$(echo "($led_at - $term_at) * 1000" | bc -l)
    figures+=("$ms")
    printf 'run %2d: hand-off %.1f ms\n' "$run" "$ms"
    kill -TERM "$(pid_of "candidate-$run")"
    wait
done
printf '%s\n' "${figures[@]}" | sort -n | awk '{ a[NR] = $1 } END {
    printf "runs %d: median %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms\n",
        NR, a[int((NR + 1) / 2)], a[int(NR * 0.9 + 0.5)], a[int(NR * 0.99 + 0.5)], a[NR] }'
