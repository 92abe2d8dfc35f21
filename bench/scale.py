#!/usr/bin/env python3
"""What one relay process and one core worker cost per byte and per file, for docs/scale.md.

Sends a workload through a relay on loopback and pulls it (one shot each, SQLite catalogues),
and reads the CPU seconds each process used (the relay's from /proc before it stops, send's
and pull's from their rusage): MB per CPU-second of the relay (sealed bytes, which it receives,
hashes, stores and serves once), of the worker (raw bytes delivered) and of the sender, and
files per CPU-second of each. Every delivered file is checked by SHA-256.

Workloads: the 14 A–N batches (bench/corpus.py, large files), and N small files sent one
object each (--bundle-below 0, the worst case for the relay: a request per file each way) or in
bundles (the default).

Usage: bench/scale.py [--scale 0.003] [--small 5000] [--runs 3]
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

from binary import FORTE
from corpus import build_inbox, build_small_inbox
from site_setup import make_site, start_relay
from wan import digest_tree

WORK = Path(os.environ.get("FORTE_BENCH_DIR", "/tmp/forte-bench")) / "scale"


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a running process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(cmd) -> float:
    """Runs `cmd`; returns its CPU seconds (user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def one_run(inbox: Path, send_flags: list) -> dict:
    for name in ["relay", "dest"]:
        shutil.rmtree(WORK / name, ignore_errors=True)
    for catalog in WORK.glob("*.sqlite*"):
        catalog.unlink()
    relay, url, fingerprint = start_relay(FORTE, WORK / "relay", WORK / "tokens.toml", "127.0.0.1:0")
    try:
        conn = ["--relay", url, "--relay-fingerprint", fingerprint, "--token-file"]
        started = time.monotonic()
        send = timed([FORTE, "--catalog", WORK / "edge.sqlite", "send", inbox, "--recipient",
                      WORK / "keys/core.pub", "--sign", WORK / "keys/edge.key", "-q", *send_flags,
                      *conn, WORK / "edge.token"])
        stored = sum(p.stat().st_size for p in (WORK / "relay").rglob("part-*") if p.is_file())
        pull = timed([FORTE, "--catalog", WORK / "core.sqlite", "pull", "--to", WORK / "dest",
                      "--identity", WORK / "keys/core.key", "--trust", WORK / "keys/edge.pub", "-q",
                      *conn, WORK / "core.token"])
        seconds = time.monotonic() - started
        relay_cpu = cpu_of(relay.pid)
    finally:
        relay.terminate()
        relay.wait()
    return {"send": send, "pull": pull, "relay": relay_cpu, "sealed": stored, "seconds": seconds}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=0.003)
    ap.add_argument("--small", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    make_site(FORTE, WORK, "scale")
    large, small = WORK / "inbox-large", WORK / "inbox-small"
    raw = {"A–N": build_inbox(large, args.scale), "small": build_small_inbox(small, args.small)}
    files = {"A–N": sum(1 for p in large.rglob("*") if p.is_file() and p.name != ".ready"),
             "small": args.small}
    workloads = {"A–N": (large, []), f"{args.small} small files, one object each": (small, ["--bundle-below", "0"]),
                 f"{args.small} small files, bundled": (small, [])}
    results = {name: [] for name in workloads}
    for r in range(args.runs):
        for name, (inbox, flags) in workloads.items():
            result = one_run(inbox, flags)
            if digest_tree(WORK / "dest" / "scale") != digest_tree(inbox):
                sys.exit(f"{name}: the delivered files differ from the source")
            results[name].append(result)
            print(f"round {r + 1}: {name}: send {result['send']:.2f}, relay {result['relay']:.2f}, "
                  f"pull {result['pull']:.2f} CPU s; {result['seconds']:.1f} s", file=sys.stderr)
    print(f"\nmedians of {args.runs} runs; CPU seconds per process; loopback, one shot each\n")
    print("| workload | raw MB | sealed MB | files | send CPU s | relay CPU s | pull CPU s "
          "| relay sealed MB per CPU-s | relay files per CPU-s | worker raw MB per CPU-s | worker files per CPU-s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, rows in results.items():
        key = "A–N" if name == "A–N" else "small"
        med = {k: statistics.median(row[k] for row in rows) for k in ["send", "relay", "pull", "sealed"]}
        print(f"| {name} | {raw[key] / 1e6:.0f} | {med['sealed'] / 1e6:.0f} | {files[key]} | {med['send']:.2f} "
              f"| {med['relay']:.2f} | {med['pull']:.2f} | {med['sealed'] / 1e6 / med['relay']:.0f} "
              f"| {files[key] / med['relay']:.0f} | {raw[key] / 1e6 / med['pull']:.0f} "
              f"| {files[key] / med['pull']:.0f} |")


if __name__ == "__main__":
    main()
