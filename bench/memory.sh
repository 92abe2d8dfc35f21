#!/usr/bin/env bash
# Peak memory of packing one large file at default settings, measured with /usr/bin/time -v.
# The file is random (incompressible): the worst case, where compressed parts are as large as
# raw ones. Usage: bench/memory.sh [SIZE, default 4G]
set -euo pipefail
cd "$(dirname "$0")/.."
size="${1:-4G}"
work="${FORTE_BENCH_DIR:-/tmp/forte-bench}/memory"
out=/dev/shm/forte-bench-memory
mkdir -p "$work"
cargo build --release -q
forte=target/release/forte
[ -d "$work/keys" ] || "$forte" keygen --dir "$work/keys" >/dev/null
big="$work/random-$size.bin"
[ -f "$big" ] || head -c "$size" /dev/urandom > "$big"
rm -rf "$out"
/usr/bin/time -v "$forte" pack "$big" --to "$out" --recipient "$work/keys/core.pub" \
    --sign "$work/keys/edge.key" -q 2> "$work/time.txt"
rm -rf "$out"
grep -E 'Maximum resident set size|Elapsed \(wall clock\)|Percent of CPU' "$work/time.txt"
rss_kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$work/time.txt")
echo "peak RSS: $((rss_kb / 1024)) MiB for a $size file (limit 300 MiB)"
