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

With --store s3 (or both, alternating in the same rounds) the relay's store is a bucket of a
local versitygw (built by test.sh into target/go/bin, or in ~/go/bin), whose CPU seconds are
counted beside the relay's: the S3 server does the disk writes the directory relay does itself.

The relay's store (its directory, or the S3 server's) and the core's destination are each a
fresh ext4 on a loop device per run, as on machines of their own (wan.Storage); with --host-fs
both stay under the work directory on the host's file system. The send ends when the relay's
store is durable: the directory relay flushes before it answers, versitygw never flushes (a
real S3 server does), so the store's file system is flushed (`sync -f`) inside the send's time.

Usage: bench/scale.py [--scale 0.003] [--small 5000] [--runs 3] [--store dir|s3|both] [--only TEXT]
                      [--host-fs]
"""

import argparse
import os
import re
import ssl
import urllib.request
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
from wan import Storage, digest_tree

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


S3_KEYS = {"AWS_ACCESS_KEY_ID": "forte-bench", "AWS_SECRET_ACCESS_KEY": "forte-bench-secret-0123",
           "AWS_REGION": "us-east-1"}


def versitygw() -> Path:
    for candidate in [Path(__file__).resolve().parent.parent / "target/go/bin/versitygw",
                      Path.home() / "go/bin/versitygw"]:
        if candidate.exists():
            return candidate
    sys.exit("versitygw is missing: ./test.sh builds it into target/go/bin "
             "(go install github.com/versity/versitygw/cmd/versitygw@v1.8.0)")


def bucket_requests(url: str, token: str) -> dict:
    """The relay's requests to its bucket so far, by operation (its /metrics, read with a core
    token; the relay's certificate is pinned elsewhere, so not checked here)."""
    request = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"})
    text = urllib.request.urlopen(request, context=ssl._create_unverified_context()).read().decode()
    found = re.findall(r'^forte_relay_bucket_requests_total\{op="(\w+)"\} (\d+)', text, re.M)
    return {op: int(n) for op, n in found}


def one_run(inbox: Path, send_flags: list, store: str, volumes) -> dict:
    """One send and one pull. With `volumes` (the relay's and the core's), each is a fresh
    file system of its own, as on separate machines; else everything is under WORK."""
    if volumes:
        for volume in volumes:
            volume.remake()
        relay_root, core_root = (v.mount for v in volumes)
    else:
        relay_root = core_root = WORK
        for name in ["relay", "dest", "s3"]:
            shutil.rmtree(WORK / name, ignore_errors=True)
    for catalog in WORK.glob("*.sqlite*"):
        catalog.unlink()
    s3, env = None, dict(os.environ)
    if store == "s3":
        (relay_root / "s3/relay").mkdir(parents=True)
        env.update(S3_KEYS, AWS_ENDPOINT_URL="http://127.0.0.1:7079")
        s3 = subprocess.Popen([versitygw(), "--access", S3_KEYS["AWS_ACCESS_KEY_ID"], "--secret",
                               S3_KEYS["AWS_SECRET_ACCESS_KEY"], "--port", "127.0.0.1:7079", "posix",
                               relay_root / "s3"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
    tree = relay_root / ("s3/relay/store" if store == "s3" else "relay")
    relay, url, fingerprint = start_relay(FORTE, "s3://relay/store" if store == "s3" else relay_root / "relay",
                                          WORK / "tokens.toml", "127.0.0.1:0", env=env)
    try:
        conn = ["--relay", url, "--relay-fingerprint", fingerprint, "--token-file"]
        started = time.monotonic()
        send = timed([FORTE, "--catalog", WORK / "edge.sqlite", "send", inbox, "--recipient",
                      WORK / "keys/core.pub", "--sign", WORK / "keys/edge.key", "--site", "scale", "-q", *send_flags,
                      *conn, WORK / "edge.token"])
        # What the relay's store holds counts as sent once durable: the directory relay flushed
        # before answering, versitygw never does (a real S3 server does), so its file system
        # is flushed here, inside the send's time, as it would be by then.
        subprocess.run(["sync", "-f", relay_root], check=True)
        sent = time.monotonic()
        stored = sum(p.stat().st_size for p in tree.rglob("part-*") if p.is_file())
        pull = timed([FORTE, "--catalog", WORK / "core.sqlite", "pull", "--to", core_root / "dest",
                      "--identity", WORK / "keys/core.key", "--trust", f"scale={WORK / 'keys/edge.pub'}", "-q",
                      *conn, WORK / "core.token"])
        ended = time.monotonic()
        requests = bucket_requests(url, (WORK / "core.token").read_text().strip()) if s3 else {}
        relay_cpu = cpu_of(relay.pid)
        s3_cpu = cpu_of(s3.pid) if s3 else 0.0
    finally:
        relay.terminate()
        relay.wait()
        if s3:
            s3.terminate()
            s3.wait()
    return {"send": send, "pull": pull, "relay": relay_cpu, "s3": s3_cpu, "sealed": stored, "requests": requests,
            "send_s": sent - started, "pull_s": ended - sent, "seconds": ended - started}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=0.003)
    ap.add_argument("--small", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--store", choices=["dir", "s3", "both"], default="dir",
                    help="the relay's store: a directory, a bucket of a local versitygw, or each in turn")
    ap.add_argument("--host-fs", action="store_true",
                    help="keep the relay's store and the core's destination on the host's file system, "
                         "beside each other (a flush by the core then also flushes what the S3 server "
                         "left unflushed), instead of a fresh file system each")
    ap.add_argument("--only", action="append",
                    help="run only the workloads whose name contains this (repeatable: A–N, bundled, one object)")
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
    if args.only:
        workloads = {n: w for n, w in workloads.items() if any(o in n for o in args.only)}
    stores = ["dir", "s3"] if args.store == "both" else [args.store]
    results = {(name, store): [] for name in workloads for store in stores}
    volumes = None if args.host_fs else (Storage("2G", WORK / "relay-vol"), Storage("4G", WORK / "core-vol"))
    try:
        rounds(args, workloads, stores, results, volumes)
    finally:
        for volume in volumes or []:
            volume.unmount()
    report(args, results, raw, files)


def rounds(args, workloads, stores, results, volumes):
    for r in range(args.runs):
        for name, (inbox, flags) in workloads.items():
            for store in stores:
                result = one_run(inbox, flags, store, volumes)
                dest = (volumes[1].mount if volumes else WORK) / "dest" / "scale"
                if digest_tree(dest) != digest_tree(inbox):
                    sys.exit(f"{name}, {store}: the delivered files differ from the source")
                results[(name, store)].append(result)
                print(f"round {r + 1}: {name}, {store}: send {result['send']:.2f}, relay {result['relay']:.2f}, "
                      f"S3 server {result['s3']:.2f}, pull {result['pull']:.2f} CPU s; send {result['send_s']:.2f} s, "
                      f"pull {result['pull_s']:.2f} s; bucket requests {result['requests']}", file=sys.stderr)


def report(args, results, raw, files):
    print(f"\nmedians of {args.runs} runs; CPU seconds per process; loopback, one shot each\n")
    print("| workload | store | raw MB | sealed MB | files | send CPU s | relay CPU s | S3 server CPU s | pull CPU s "
          "| relay (+ S3 server) sealed MB per CPU-s | relay (+ S3 server) files per CPU-s "
          "| worker raw MB per CPU-s | worker files per CPU-s | send s | pull s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (name, store), rows in results.items():
        key = "A–N" if name == "A–N" else "small"
        med = {k: statistics.median(row[k] for row in rows)
               for k in ["send", "relay", "s3", "pull", "sealed", "send_s", "pull_s"]}
        store_cpu = med["relay"] + med["s3"]
        print(f"| {name} | {store} | {raw[key] / 1e6:.0f} | {med['sealed'] / 1e6:.0f} | {files[key]} "
              f"| {med['send']:.2f} | {med['relay']:.2f} | {med['s3']:.2f} | {med['pull']:.2f} "
              f"| {med['sealed'] / 1e6 / store_cpu:.0f} | {files[key] / store_cpu:.0f} "
              f"| {raw[key] / 1e6 / med['pull']:.0f} | {files[key] / med['pull']:.0f} "
              f"| {med['send_s']:.2f} | {med['pull_s']:.2f} |")
    for name in {name for name, _ in results}:
        if (name, "dir") in results and (name, "s3") in results:
            took = {store: statistics.median(row["seconds"] for row in results[(name, store)])
                    for store in ["dir", "s3"]}
            print(f"\n{name}: send and pull, the directory relay's time ÷ the bucket relay's "
                  f"(median of each): {took['dir']:.2f} s ÷ {took['s3']:.2f} s = {took['dir'] / took['s3']:.2f}×")


if __name__ == "__main__":
    main()
