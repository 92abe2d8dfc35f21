#!/usr/bin/env bash
# Acceptance round trip with stock tools as the judge: builds a tree with empty files, an empty
# directory, 1 B, exactly 16 MiB, 16 MiB + 1 and a 1 GiB + 1 file of real-looking data, unicode
# names and a deep path; packs and unpacks it with the release binary; compares `sha256sum` of
# every file and every file's mtime. Usage: bench/roundtrip.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
forte="$PWD/target/release/forte"
work="${FORTE_BENCH_DIR:-/tmp/forte-bench}/roundtrip"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
src=src
mkdir -p "$src/empty-dir" "$src/Ünïcødé/日本語" "$src/$(printf 'deep%.0s/' {1..30})"
: > "$src/empty.bin"
printf x > "$src/one-byte"
head -c 16777216 /dev/urandom > "$src/exactly-16MiB"
head -c 16777217 /dev/urandom > "$src/16MiB-plus-1"
# 1 GiB + 1 of real, compressible bytes: the system libraries, twice over. `head` closing the
# pipe ends the producer with SIGPIPE, which is expected; the size is checked below.
for _ in 1 2 3; do find /usr/lib/x86_64-linux-gnu -type f -print0 | xargs -0 cat 2>/dev/null; done \
    | head -c 1073741825 > "$src/over-1GiB.bin" || true
[ "$(stat -c %s "$src/over-1GiB.bin")" -eq 1073741825 ] || { echo "could not build the 1 GiB file" >&2; exit 1; }
echo "capteur ✓" > "$src/Ünïcødé/日本語/données.txt"
echo deep > "$src/$(printf 'deep%.0s/' {1..30})leaf.txt"

"$forte" keygen --dir keys > /dev/null
"$forte" pack "$src" --to packed --recipient keys/core.pub --sign keys/edge.key
"$forte" unpack packed --to restored --identity keys/core.key --trust keys/edge.pub

listing() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum); }
mtimes() { (cd "$1" && find . -mindepth 1 \( -type f -o -empty \) -printf '%P %y %T@\n' | sort); }
diff <(listing "$src") <(listing restored)
diff <(mtimes "$src") <(mtimes restored)
echo "identical: $(listing restored | wc -l) files (sha256sum), $(mtimes restored | wc -l) entries with mtimes incl. empty dirs"
ls -l "$src/over-1GiB.bin" | awk '{print "largest file:", $5, "bytes"}'
