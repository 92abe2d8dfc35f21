#!/usr/bin/env python3
"""The benchmarks' data, built one way for every script: a corpus of real files found on this
machine, and the FORTE test set's 14 batches A–N cut from it.

corpus   ≥ 1 GB of real, mixed files copied from the system libraries, the Rust toolchain,
         /usr/share/doc and /usr/include (bench/prepare.py and `forte bench compress` read it)
batches  A–N with sizes proportional to the papers' 337 GB (times --scale): bag-like files of
         up to 8 MB cut in order from the corpus's contents, plus a ~350 kB text log per batch,
         each marked ready (bench/network.py, wan.py and policies.py send them)
small    one batch of N real small files: the C headers of 1–64 kB under /usr/include, in
         path order, repeated under copy-K/ directories when the machine has fewer than N
         (bench/wan.py --small N)

Both depend only on the machine's files, so the same machine gives the same bytes every time.

Usage: bench/corpus.py [--corpus DIR] [--batches DIR --scale 0.003]
"""

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

WORK = Path(os.environ.get("FORTE_BENCH_DIR", "/tmp/forte-bench"))
CORPUS = WORK / "corpus"
CORPUS_BYTES = 1_200_000_000
BATCHES = [("A", 0.9), ("B", 2.7), ("C", 30.0), ("D", 24.3), ("E", 5.9), ("F", 29.5), ("G", 21.2),
           ("H", 27.4), ("I", 94.8), ("J", 39.7), ("K", 43.6), ("L", 4.5), ("M", 3.1), ("N", 9.3)]


def corpus_sources():
    sysroot = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True).stdout.strip()
    return [
        Path("/usr/lib/x86_64-linux-gnu"),  # system libraries
        Path(sysroot) / "lib",  # toolchain files
        Path("/usr/share/doc"),  # text
        Path("/usr/include"),  # text (C headers)
    ]


def build_corpus(dest: Path) -> None:
    """Copies regular files (no links) from the sources until the corpus holds enough bytes."""
    print(f"building corpus in {dest} …", file=sys.stderr)
    total = 0
    for src in corpus_sources():
        for dirpath, _dirs, files in os.walk(src):
            for name in sorted(files):
                path = Path(dirpath) / name
                if path.is_symlink() or not path.is_file():
                    continue
                target = dest / path.relative_to("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    shutil.copy2(path, target)
                except OSError:
                    continue
                total += target.stat().st_size
        if total >= CORPUS_BYTES:
            break
    if total < 1_000_000_000:
        sys.exit(f"corpus has only {total} bytes; need at least 1 GB of real files")


def ensure_corpus(dest: Path = CORPUS) -> Path:
    """The corpus at `dest`, built first if it is not there."""
    if not dest.exists():
        build_corpus(dest)
    return dest


def corpus_stats(corpus: Path):
    """Files and bytes of the corpus."""
    files = [p for p in corpus.rglob("*") if p.is_file() and not p.is_symlink()]
    return len(files), sum(p.stat().st_size for p in files)


def real_bytes():
    """An endless stream of the corpus's file contents, in a fixed order."""
    corpus = ensure_corpus()
    while True:
        for dirpath, dirs, files in os.walk(corpus):
            dirs.sort()
            for f in sorted(files):
                p = Path(dirpath) / f
                if p.is_file() and not p.is_symlink():
                    yield p.read_bytes()


def text_bytes(n):
    out = bytearray()
    for dirpath, _, files in os.walk("/usr/share/doc"):
        for f in files:
            p = Path(dirpath) / f
            if p.suffix in ("", ".txt") and p.is_file() and not p.is_symlink():
                out += p.read_bytes()[:50_000]
                if len(out) >= n:
                    return bytes(out[:n])
    return bytes(out.ljust(n, b"."))


def build_inbox(inbox: Path, scale: float) -> int:
    stream, pending, total = real_bytes(), bytearray(), 0
    log = text_bytes(350_000)
    for name, gb in BATCHES:
        batch = inbox / f"batch-{name}"
        (batch / "bags").mkdir(parents=True)
        left, n = int(gb * 1e9 * scale), 0
        while left > 0:
            size = min(left, 8_000_000)
            while len(pending) < size:
                pending += next(stream)
            (batch / "bags" / f"{n:04d}.bag").write_bytes(pending[:size])
            del pending[:size]
            left, n, total = left - size, n + 1, total + size
        (batch / "vehicle.log").write_bytes(log)
        (batch / ".ready").touch()
        total += len(log)
    return total


def build_incompressible_batch(inbox: Path, megabytes: int) -> int:
    """One ready batch of 32 MB files of random bytes (what recordings already compressed by
    their camera or logger look like to zstd), `megabytes` in all; returns their bytes."""
    batch, total, n = inbox / "batch-media", 0, 0
    batch.mkdir(parents=True, exist_ok=True)
    while total < megabytes * 1_000_000:
        size = min(32_000_000, megabytes * 1_000_000 - total)
        (batch / f"{n:04d}.mp4").write_bytes(os.urandom(size))
        total, n = total + size, n + 1
    (batch / ".ready").touch()
    return total


def build_small_inbox(inbox: Path, count: int) -> int:
    """One ready batch of `count` real files of 1–64 kB; returns their bytes."""
    headers = sorted(p for p in Path("/usr/include").rglob("*.h")
                     if p.is_file() and not p.is_symlink() and 1024 <= p.stat().st_size <= 65536)
    if not headers:
        sys.exit("no C headers of 1-64 kB under /usr/include: apt-get install linux-libc-dev libc6-dev")
    batch, total = inbox / "batch-small", 0
    for n in range(count):
        src = headers[n % len(headers)]
        rel = src.relative_to("/usr/include")
        dest = batch / f"copy-{n // len(headers)}" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        total += dest.stat().st_size
    (batch / ".ready").touch()
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--batches", type=Path, help="also build the batches A–N here (replacing it)")
    ap.add_argument("--scale", type=float, default=0.003)
    args = ap.parse_args()
    ensure_corpus(args.corpus)
    nfiles, nbytes = corpus_stats(args.corpus)
    print(f"corpus: {nfiles} files, {nbytes / 1e9:.2f} GB in {args.corpus}")
    if args.batches:
        shutil.rmtree(args.batches, ignore_errors=True)
        raw = build_inbox(args.batches, args.scale)
        print(f"batches A–N: {raw / 1e6:.0f} MB in {args.batches}")


if __name__ == "__main__":
    main()
