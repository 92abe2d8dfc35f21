#!/usr/bin/env bash
# The A–N end-to-end benchmark (bench/network.py: send and a watching pull over loopback) for two
# builds in one invocation, rounds interleaved, then each build's median rate and time: how a
# change is shown not to slow the transfer on a shared, noisy machine.
# Usage: bench/ab_end_to_end.sh BASELINE_BINARY CANDIDATE_BINARY [ROUNDS=9] [SCALE=0.003]
set -euo pipefail
cd "$(dirname "$0")/.."
base=$1 cand=$2 rounds=${3:-9} scale=${4:-0.003}
out=$(mktemp)
for round in $(seq 1 "$rounds"); do
    for which in base cand; do
        binary=$base
        [ "$which" = cand ] && binary=$cand
        echo "=== round $round $which" | tee -a "$out"
        FORTE_BINARY=$binary python3 bench/network.py --scale "$scale" 2>&1 \
            | grep -E "^\| (last file delivered|effective raw)" | tee -a "$out"
    done
done
python3 - "$out" <<'PY'
import re, statistics, sys
rate, secs, cur = {"base": [], "cand": []}, {"base": [], "cand": []}, None
for line in open(sys.argv[1]):
    if m := re.match(r"=== round \d+ (\w+)", line):
        cur = m.group(1)
    elif m := re.search(r"effective raw-data rate delivered \| ([\d.]+)", line):
        rate[cur].append(float(m.group(1)))
    elif m := re.search(r"last file delivered after \| ([\d.]+)", line):
        secs[cur].append(float(m.group(1)))
for k in rate:
    print(f"{k}: rates {rate[k]} MB/s, median {statistics.median(rate[k]):.1f} MB/s, "
          f"median time {statistics.median(secs[k]):.1f} s")
print(f"candidate / baseline (median rate): {statistics.median(rate['cand']) / statistics.median(rate['base']):.3f}")
PY
rm -f "$out"
