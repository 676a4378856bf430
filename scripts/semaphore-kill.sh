#!/bin/bash
# How long after the SIGKILL of a `vvm run --semaphore` holder's whole tree the queued run's
# command starts. Usage: scripts/semaphore-kill.sh BIN STORE (STORE: an etcd://HOST:PORT/ or a
# sqlite:PATH where the semaphore `work` exists with limit 1 and nobody holds it). Lease 4 s.
set -eu
bin=$1
store=$2
log=$(mktemp)
setsid "$bin" run --store "$store" --lease 4s --semaphore work -- \
  sh -c "echo start1 \$(date +%s%N) >> $log; sleep 600" 2>/dev/null &
holder=$!
until grep -q start1 "$log"; do sleep 0.05; done
"$bin" run --store "$store" --lease 4s --semaphore work -- \
  sh -c "echo start2 \$(date +%s%N) >> $log; sleep 600" 2>/dev/null &
waiter=$!
# Queued, and past a keepalive or two.
sleep 1.5
killed=$(date +%s%N)
kill -KILL -- "-$holder"
until grep -q start2 "$log"; do sleep 0.02; done
started=$(awk '/start2/ {print $2}' "$log")
echo "the queued command started $(((started - killed) / 1000000)) ms after the SIGKILL"
kill -TERM "$waiter"
wait "$waiter" 2>/dev/null || true
rm -f "$log"
