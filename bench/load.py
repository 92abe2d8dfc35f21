#!/usr/bin/env python3
"""Load: many small files in one batch, and many batches at once, through relay on loopback.

Two runs, each `forte send` (one shot) then `forte pull` (one shot), each under
`/usr/bin/time` for its peak memory:

1. one batch of --files small files (1–500 kB, half random bytes, half text);
2. --batches batches of 20 files (1–500 kB) each, all ready at once;
3. with --headers N, one batch of N real small files (1–64 kB C headers, bench/corpus.py).

Reports files/s and MB/s of each leg and the peak RSS of each process, and checks every file
arrived byte-identical.

Usage: bench/load.py [--files 10000] [--batches 50] [--headers 100000] [--only headers]
"""

import argparse
import os
import random
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from corpus import build_small_inbox
from site_setup import make_site, start_relay
from binary import FORTE

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("FORTE_BENCH_DIR", "/tmp/forte-bench")) / "load"


def timed(cmd):
    """Runs cmd; returns (seconds, peak RSS in MiB)."""
    start = time.monotonic()
    out = subprocess.run(["/usr/bin/time", "-f", "maxrss %M", *map(str, cmd)], check=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True).stderr
    rss = int(re.search(r"maxrss (\d+)", out).group(1)) / 1024
    return time.monotonic() - start, rss


def make_files(batch: Path, count: int, rng: random.Random, text: bytes) -> int:
    total = 0
    for i in range(count):
        size = rng.randint(1_000, 500_000)
        data = os.urandom(size) if i % 2 else (text * (size // len(text) + 1))[:size]
        path = batch / f"d{i // 1000:02d}" / f"f{i:05d}.dat"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        total += size
    (batch / ".ready").touch()
    return total


SEND_ARGS = []


def run(name, make):
    work = WORK / name
    shutil.rmtree(work, ignore_errors=True)
    inbox, dest = work / "inbox", work / "dest"
    inbox.mkdir(parents=True)
    files, raw = make(inbox)
    make_site(FORTE, work, "load")
    relay, url, fingerprint = start_relay(FORTE, work / "relay", work / "tokens.toml", "127.0.0.1:0")
    try:
        conn = ["--relay", url, "--relay-fingerprint", fingerprint, "--token-file"]
        send_s, send_rss = timed([FORTE, "--catalog", work / "edge.sqlite", "send", inbox, "-q",
                                  "--recipient", work / "keys/core.pub", "--sign", work / "keys/edge.key",
                                  "--site", "load", *SEND_ARGS, *conn, work / "edge.token"])
        pull_s, pull_rss = timed([FORTE, "--catalog", work / "core.sqlite", "pull", "--to", dest, "-q",
                                  "--identity", work / "keys/core.key", "--trust", f"load={work / 'keys/edge.pub'}",
                                  *conn, work / "core.token"])
    finally:
        relay.terminate()
        relay.wait()
    for batch in inbox.iterdir():
        subprocess.run(["diff", "-r", "-x", ".ready", batch, dest / "load" / batch.name], check=True)
    print(f"| {name} | {files} files, {raw / 1e6:.0f} MB | send {send_s:.1f} s: {files / send_s:.0f} files/s, "
          f"{raw / 1e6 / send_s:.0f} MB/s, peak RSS {send_rss:.0f} MiB | pull {pull_s:.1f} s: "
          f"{files / pull_s:.0f} files/s, {raw / 1e6 / pull_s:.0f} MB/s, peak RSS {pull_rss:.0f} MiB |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--headers", type=int, help="also one batch of N real 1-64 kB files")
    ap.add_argument("--only", choices=["headers"], help="run only the --headers batch")
    ap.add_argument("--send-args", default="", help="more flags for forte send, e.g. '--connections 4'")
    args = ap.parse_args()
    SEND_ARGS.extend(shlex.split(args.send_args))
    subprocess.run(["cargo", "build", "--release", "-q"], cwd=ROOT, check=True)
    rng = random.Random(1)
    text = (ROOT / "README.md").read_bytes()
    print(f"machine: {os.cpu_count()} cores; relay on loopback; every file checked with diff -r")
    print("| run | data | edge (send) | core (pull) |")
    print("|---|---|---|---|")
    if args.headers:
        run("small-real-files", lambda inbox: (args.headers, build_small_inbox(inbox, args.headers)))
    if args.only:
        return
    run("one-batch", lambda inbox: (args.files, make_files(inbox / "many", args.files, rng, text)))

    def many(inbox):
        raw = sum(make_files(inbox / f"batch-{b:03d}", 20, rng, text) for b in range(args.batches))
        return args.batches * 20, raw

    run(f"{args.batches}-batches", many)


if __name__ == "__main__":
    main()
