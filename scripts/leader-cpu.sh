#!/bin/bash
# CPU of a leading `vvm run` (the vvm process itself, user + system) over SECONDS, read from
# /proc/PID/stat. Usage: scripts/leader-cpu.sh BIN STORE SECONDS (STORE: a fresh sqlite:PATH,
# or an etcd://HOST:PORT/ with the slot free).
set -eu
bin=$1
store=$2
seconds=$3
"$bin" --log-level warn run --store "$store" --lease 12s --address cpu -- sleep 1000 2>/dev/null &
pid=$!
# Past the start and the first insert.
sleep 2
before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
sleep "$seconds"
after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
kill -TERM "$pid"
wait "$pid" 2>/dev/null || true
ticks=$(getconf CLK_TCK)
echo "cpu $(((after - before) * 1000 / ticks)) ms over ${seconds} s"
