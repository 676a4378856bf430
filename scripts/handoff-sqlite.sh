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
#
# STANDBYS=N (default 0) starts N more waiting `vvm run`s beside the candidate: the hand-off is
# then timed to the first of them that leads, and in the first run the CPU the waiting processes
# use over IDLE_SECONDS (default 10) while the holder holds is printed (from /proc/PID/stat).
set -euo pipefail

bin=${1:-target/release/vvm}
runs=${2:-20}
round=${3:-1s}
standbys=${STANDBYS:-0}
idle_seconds=${IDLE_SECONDS:-10}
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

# Waits (at most 10 s) for the first of the waiting processes of run $1 to print `leading`;
# echoes the stamp of that line.
first_leading_at() {
    local run=$1
    for _ in $(seq 1000); do
        local stamps
        stamps=$(cat "$work"/candidate-"$run".log "$work"/standby-"$run"-*.log 2>/dev/null \
            | grep " leading " | cut -d' ' -f1 | sort -n | head -1)
        if [ -n "$stamps" ]; then
            echo "$stamps"
            return 0
        fi
        sleep 0.01
    done
    echo "no leader among the candidates of run $run" >&2
    return 1
}

# User + system CPU ticks of the processes $@ (their /proc/PID/stat fields 14 and 15).
ticks_of() {
    local total=0 pid
    for pid in "$@"; do
        local fields
        fields=$(sed 's/.*) //' "/proc/$pid/stat")
        set -- $fields
        total=$((total + ${12} + ${13}))
    done
    echo "$total"
}

figures=()
for run in $(seq "$runs"); do
    rm -f "$work"/*
    start "holder-$run"
    leading_at "holder-$run" >/dev/null
    start "candidate-$run"
    for standby in $(seq "$standbys"); do
        start "standby-$run-$standby"
    done
    if [ "$run" = 1 ] && [ "$standbys" -gt 0 ]; then
        sleep 3
        waiting=()
        for name in "candidate-$run" $(seq -f "standby-$run-%g" "$standbys"); do
            waiting+=("$(pid_of "$name")")
        done
        before=$(ticks_of "${waiting[@]}")
        sleep "$idle_seconds"
        after=$(ticks_of "${waiting[@]}")
        hz=$(getconf CLK_TCK)
        echo "$((standbys + 1)) waiting: $(echo "($after - $before) / $hz" | bc -l | xargs printf '%.2f') s of CPU over $idle_seconds s = $(echo "($after - $before) * 100 / $hz / $idle_seconds" | bc -l | xargs printf '%.2f') % of a core"
    fi
    # The candidate is refused and waits for its next round; stop the holder somewhere in it.
    sleep "0.$((RANDOM % 9 + 1))"
    holder=$(pid_of "holder-$run")
    term_at=$EPOCHREALTIME
    kill -TERM "$holder"
    led_at=$(first_leading_at "$run")
    ms=$(echo "($led_at - $term_at) * 1000" | bc -l)
    figures+=("$ms")
    printf 'run %2d: hand-off %.1f ms\n' "$run" "$ms"
    for name in "candidate-$run" $(seq -f "standby-$run-%g" "$standbys"); do
        kill -TERM "$(pid_of "$name")" 2>/dev/null || true
    done
    wait
done
printf '%s\n' "${figures[@]}" | sort -n | awk '{ a[NR] = $1 } END {
    printf "runs %d: median %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms\n",
        NR, a[int((NR + 1) / 2)], a[int(NR * 0.9 + 0.5)], a[int(NR * 0.99 + 0.5)], a[NR] }'
