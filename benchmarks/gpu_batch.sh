#!/usr/bin/env bash
# Several gpu_session.sh steps in one device call, each into its own folder, packed as ONE file:
# the device tool brings back at most 8 files, and steps that share a CSV name would overwrite
# each other in one $OUT.
#   bash benchmarks/gpu_batch.sh STEP [STEP ...]   ->  $OUT/results.tgz (re-packed after every
#   step, so a call cut short still returns what finished) and $OUT/summary.log
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
RES=$(mktemp -d /tmp/strata-batch.XXXXXX)
for step in "$@"; do
    t0=$(date +%s)
    mkdir -p "$RES/$step"
    OUT="$RES/$step" bash "$(dirname "$0")/gpu_session.sh" "$step" > "$RES/$step/stdout.log" 2>&1
    rc=$?
    { echo "== $step: rc $rc, $(( $(date +%s) - t0 )) s"; grep -v "it/s\]\|layer/s\|WARNING: Target" "$RES/$step/stdout.log" | tail -15; } | tee -a "$OUT/summary.log"
    tar czf "$OUT/results.tgz.part" -C "$RES" . && mv "$OUT/results.tgz.part" "$OUT/results.tgz"
done
