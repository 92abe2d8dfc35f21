#!/usr/bin/env bash
# forte against the papers' baselines and today's tools, every number of docs/benchmarks/log/2026-11.md's
# issue-#7 sections in one invocation, on the same corpus and machine:
#   1. forte-bench compress on the corpus: every codec and level, the Pareto front, a level
#   2. bench/prepare.py: forte pack against zstd alone and the papers' CB and CB-IM chains
#   3. bench/wan.py: end to end over 65 MB/s + 20 ms against rsync + copy, CB-IM + rsync,
#      rsync -z zstd (rsync's default level 3, and level 1) and rclone copy
# Each step's output (tables in Markdown, charts in SVG) goes to OUT (default
# target/bench-results/DATE), beside a log of what the machine was. Run as root, after the
# README's first command and bench/setup.sh; 22 minutes on 2 cores (2026-11-23).
#
# Usage (as root): bench/baselines.sh [--runs 5] [--level 1] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=5
level=1
out="target/bench-results/$(date -u +%F)"
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs="$2"; shift 2 ;;
        --level) level="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "run as root: bench/wan.py creates network namespaces" >&2; exit 2; }
mkdir -p "$out"
cargo build --release -q
corpus="${FORTE_BENCH_DIR:-/tmp/forte-bench}/corpus"
python3 bench/corpus.py --corpus "$corpus" | tee "$out/machine.txt"
{
    echo "date: $(date -u '+%F %T UTC')"
    echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (with uncommitted changes)')"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
    echo "memory: $(free -g | awk '/Mem:/ {print $2}') GiB"
    echo "tools: $(rsync --version | head -1); $(rclone --version | head -1); $(zstd --version)"
} | tee -a "$out/machine.txt"

step() { echo; echo "== $1 ($(date -u +%T))"; }

step "forte-bench compress on the corpus"
start=$(date +%s)
target/release/forte-bench compress "$corpus" --plot "$out" | tee "$out/compress.md"
echo "took $(( $(date +%s) - start )) s" | tee -a "$out/compress.md"

step "prepare pass (bench/prepare.py --runs $runs)"
python3 bench/prepare.py --runs "$runs" --chart "$out/prepare.svg" | tee "$out/prepare.md"

step "end to end over the emulated WAN (bench/wan.py --runs $runs --level $level --rsync-levels 3,1)"
python3 bench/wan.py --runs "$runs" --level "$level" --rsync-levels 3,1 --chart "$out/wan.svg" | tee "$out/wan.md"

echo
echo "results in $out"
