#!/usr/bin/env python3
"""Prepare-path throughput: `forte pack` against zstd alone and the papers' two shell chains.

Every contender reads the same corpus (≥ 1 GB of real files: system libraries, toolchain
files, text) from the page cache (read into it before each run: forte drops what it has read)
and writes to tmpfs, so the numbers compare CPU work, not the
disk. Rounds are interleaved (each round runs every contender once) and the median of the
rounds is reported, because these machines are shared and noisy.

Contenders
  forte pack          one pass per file: SHA-256 → zstd -3 → age → SHA-256, per-file objects
  zstd -r (files)     `zstd -3 -T2 -r --output-dir-mirror`: compression only, per-file outputs
  tar | zstd (stream) `tar -c | zstd -3 -T2`: compression only, one stream, no per-file work
  pipe chain (CB-IM)  per file `tee >(sha256sum) | zstd -3 | gpg -e | tee >(sha256sum)`,
                      two files at a time (one per core), output discarded
  step by step (CB)   per file the same four steps as separate commands, each writing an
                      intermediate file to the output dir: `sha256sum` > NAME.sha256,
                      `zstd -3` → NAME.zst, `gpg -e` → NAME.zst.gpg (NAME.zst removed after),
                      `sha256sum` > NAME.zst.gpg.sha256; two files at a time (one per core)

Usage: bench/prepare.py [--runs 3] [--corpus DIR] [--skip-chain] [--compare NAME=PATH]
"""

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from chart import bar_chart
from corpus import corpus_stats, ensure_corpus
from binary import FORTE

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("FORTE_BENCH_DIR", "/tmp/forte-bench"))
OUT = Path("/dev/shm/forte-bench-out")


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def ensure_gpg_key(home: Path) -> str:
    uid = "bench@forte.invalid"
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = dict(os.environ, GNUPGHOME=str(home))
    listed = subprocess.run(["gpg", "--list-keys", uid], env=env, capture_output=True)
    if listed.returncode != 0:
        sh(["gpg", "--batch", "--passphrase", "", "--quick-gen-key", uid, "default", "default", "never"],
           env=env, capture_output=True)
    return uid


def chain(corpus: Path, per_file: str, prelude: str = "") -> list:
    """Runs the bash loop `per_file` (over its arguments "$@", paths like ./dir/name relative to the
    corpus) on every corpus file, two processes at a time (one per core), 64 files per process,
    with GNUPGHOME set for the benchmark key. `prelude` (a shell command list ending in `&&` or `;`)
    runs first, in the corpus directory. `per_file` may not contain a single quote."""
    return ["bash", "-c",
            f"export GNUPGHOME='{WORK}/gnupg'; cd '{corpus}' && {prelude}"
            f"find . -type f -print0 | xargs -0 -P2 -n 64 bash -c '{per_file}' _"]


def forte_pack(binary: Path, corpus: Path, keys: Path) -> list:
    return [str(binary), "pack", str(corpus), "--to", str(OUT / "forte"),
            "--recipient", str(keys / "core.pub"), "--sign", str(keys / "edge.key"), "-q"]


def contenders(corpus: Path, keys: Path, skip_chain: bool, compare: dict):
    out = {"forte pack": forte_pack(FORTE, corpus, keys)}
    for name, binary in compare.items():
        out[f"forte pack ({name})"] = forte_pack(binary, corpus, keys)
    out["zstd -3 -T2 -r (files)"] = ["zstd", "-3", "-T2", "-r", "-q", "--output-dir-mirror",
                                     str(OUT / "zstd"), str(corpus)]
    out["tar | zstd -3 -T2 (stream)"] = ["sh", "-c",
                                         f"tar -cf - -C '{corpus}' . | zstd -3 -T2 -q -c > '{OUT}/stream.zst'"]
    if not skip_chain:
        gpg = f"gpg -e -r {ensure_gpg_key(WORK / 'gnupg')} --batch --trust-model always -q"
        out["pipe chain sha256|zstd|gpg|sha256 (CB-IM)"] = chain(corpus, (
            'for f; do tee >(sha256sum >/dev/null) < "$f" | zstd -3 -q -c '
            f'| {gpg} | tee >(sha256sum >/dev/null) >/dev/null; done'))
        cb = OUT / "cb"  # mirrors the corpus tree; the directories are made once, before the files
        out["step by step with intermediate files (CB)"] = chain(corpus, (
            f'set -e; for f; do o="{cb}/$f"; sha256sum "$f" > "$o.sha256"; '
            'zstd -3 -q "$f" -o "$o.zst"; '
            f'{gpg} -o "$o.zst.gpg" "$o.zst"; rm "$o.zst"; '
            'sha256sum "$o.zst.gpg" > "$o.zst.gpg.sha256"; done'),
            prelude=f"find . -type d -printf '{cb}/%p\\0' | xargs -0 mkdir -p && ")
    return out


def warm(corpus: Path):
    """Reads the whole corpus into the page cache. forte drops what it has read from the cache
    (the edge reads each file once), so without this the contender after it would read from
    disk while the others read from memory. (Piped: GNU tar writing to /dev/null itself skips
    reading the files.)"""
    sh(["sh", "-c", f"tar -cf - -C '{corpus}' . | cat > /dev/null"])


def timed(cmd):
    """Wall seconds and CPU seconds (user + system of all the command's processes)."""
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    sh(cmd, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--corpus", type=Path, default=WORK / "corpus")
    ap.add_argument("--skip-chain", action="store_true", help="skip the slow shell chains (CB-IM and CB)")
    ap.add_argument("--chart", type=Path, help="also draw the medians as a bar chart into this SVG file")
    ap.add_argument("--compare", action="append", default=[], metavar="NAME=PATH",
                    help="also time the forte build at PATH as 'forte pack (NAME)', in the same rounds")
    args = ap.parse_args()
    compare = dict(c.split("=", 1) for c in args.compare)

    sh(["cargo", "build", "--release", "-q"], cwd=ROOT)
    ensure_corpus(args.corpus)
    keys = WORK / "keys"
    if not keys.exists():
        sh([str(FORTE), "keygen", "--dir", str(keys)], stdout=subprocess.DEVNULL)
    nfiles, nbytes = corpus_stats(args.corpus)
    runs = contenders(args.corpus, keys, args.skip_chain, compare)

    times = {name: [] for name in runs}
    cpus = {name: [] for name in runs}
    for r in range(args.runs):
        for name, cmd in runs.items():
            warm(args.corpus)
            wall, cpu = timed(cmd)
            times[name].append(wall)
            cpus[name].append(cpu)
            print(f"round {r + 1}: {name}: {wall:.2f} s wall, {cpu:.2f} s CPU", file=sys.stderr)
    shutil.rmtree(OUT, ignore_errors=True)

    med = {name: statistics.median(ts) for name, ts in times.items()}
    med_cpu = {name: statistics.median(ts) for name, ts in cpus.items()}
    forte = med["forte pack"]
    cpu = os.cpu_count()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    print(f"\nCorpus: {nfiles} files, {nbytes / 1e9:.2f} GB ({args.corpus}); machine: {cpu} cores, "
          f"{mem:.0f} GiB; median of {args.runs} interleaved rounds; output on tmpfs.\n")
    print("| contender | median wall s | MB/s | forte pack speed-up (wall) | median CPU s | CPU s per GB |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, t in med.items():
        label = name.replace("|", "\\|")
        print(f"| {label} | {t:.2f} | {nbytes / 1e6 / t:.0f} | {t / forte:.2f}× | {med_cpu[name]:.2f} "
              f"| {med_cpu[name] / (nbytes / 1e9):.2f} |")
    print("\nAll rounds (s): " + "; ".join(f"{n}: {', '.join(f'{t:.2f}' for t in ts)}" for n, ts in times.items()))
    if args.chart:
        rate = {name: nbytes / 1e6 / t for name, t in med.items()}
        cb_im = next((name for name in rate if "CB-IM" in name), None)
        bar_chart(args.chart, f"Prepare pass, {nbytes / 1e9:.2f} GB of real files (median of {args.runs})", "MB/s",
                  list(rate.items()), [(2 * rate[cb_im], "2× CB-IM")] if cb_im else [])


if __name__ == "__main__":
    main()
