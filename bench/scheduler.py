#!/usr/bin/env python3
"""Who runs the computing stages (issue 20): `--scheduler ordo` (one pool of workers choosing the
next stage by its queues) against `--scheduler threads` (each stage its own threads, sharing
the cores through CPU tokens), on `forte pack` and `forte unpack` of the corpus (bench/corpus.py,
≥ 1 GB of real files), at --cpu 1 and 2, and on the ingest writer: `forte ingest` replaying
--streams recordings at once (each 1 Mi rows of a timestamp and 32 float32 noisy sines, 143 MB;
made once under the bench directory) into Parquet, with --writers 1 and 2.

Every run reads the corpus from the page cache (read into it before each round) and writes to
tmpfs, so the numbers compare CPU work. Rounds are interleaved (each round runs every contender
once, in turn) and the median of the rounds is reported with the ratio to threads in the same
invocation. Each run's `--json` gives its per-item latency (read to sink) percentiles.

--kills: 60 % of the pool killed every 4 s (FORTE_TEST_KILL_WORKERS=0.6,4) during a pack and an
unpack of a 2 GB tree (the corpus, and its first 0.8 GB again under copy/), against the same
undisturbed, median of --runs each; the restored tree must be byte-identical to the source and
no file reported failed.

Usage: bench/scheduler.py [--runs 5] [--cpus 1,2] [--schedulers threads,ordo] [--ops pack,unpack,ingest]
                          [--streams 4] [--kills]
"""

import argparse
import array
import hashlib
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from binary import FORTE  # noqa: E402
from corpus import corpus_stats, ensure_corpus  # noqa: E402

WORK = Path(os.environ.get("FORTE_BENCH_DIR", "/tmp/forte-bench"))
OUT = Path("/dev/shm/forte-bench-scheduler")


def sh(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def warm(tree: Path):
    sh(["sh", "-c", f"tar -cf - -C '{tree}' . | cat > /dev/null"])


def machine() -> str:
    cores = os.cpu_count()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                  if line.startswith("model name")), "?")
    return f"{cores} cores ({model}), {mem:.1f} GB memory"


def run(cmd, env=None):
    """Wall seconds and the command's --json summary."""
    start = time.perf_counter()
    out = subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True,
                         env=dict(os.environ, **(env or {})))
    wall = time.perf_counter() - start
    return wall, json.loads(out.stdout)


def pack_cmd(src: Path, dest: Path, keys: Path, scheduler: str, cpu: int):
    return [FORTE, "pack", src, "--to", dest, "--recipient", keys / "core.pub", "--sign", keys / "edge.key",
            "--scheduler", scheduler, "--cpu", str(cpu), "--json"]


def unpack_cmd(packed: Path, dest: Path, keys: Path, scheduler: str, cpu: int):
    return [FORTE, "unpack", packed, "--to", dest, "--identity", keys / "core.key", "--trust", keys / "edge.pub",
            "--scheduler", scheduler, "--cpu", str(cpu), "--json"]


def ingest_cmd(recordings, schema: Path, dest: Path, scheduler: str, cpu: int):
    files = [a for r in recordings for a in ("--from-file", r)]
    return [FORTE, "ingest", *files, "--schema", schema, "--out", dest, "--writers", str(cpu),
            "--scheduler", scheduler]


SENSORS = 32
ROWS = 1 << 20


def ensure_recording() -> tuple[Path, Path]:
    """A recording of ROWS rows (int64 ns timestamp, SENSORS float32 noisy sines) and its schema,
    made once: one row group's worth of rows (65 536) repeated, each row group compressed alone."""
    rec, schema = WORK / "ingest-bench" / "turbine.bin", WORK / "ingest-bench" / "turbine.schema.toml"
    if rec.exists() and schema.exists():
        return rec, schema
    rec.parent.mkdir(parents=True, exist_ok=True)
    schema.write_text(f'timestamp = "time"\n\n[[column]]\nname = "s"\ncount = {SENSORS}\ntype = "float32"\n')
    rng = random.Random(1)
    group = bytearray()
    for row in range(65_536):
        values = array.array("f", (math.sin(row / (50 + 7 * c)) * (1 + c) + rng.gauss(0, 0.05)
                                   for c in range(SENSORS)))
        group += (row * 39_062).to_bytes(8, "little") + values.tobytes()
    with open(rec, "wb") as f:
        for _ in range(ROWS // 65_536):
            f.write(group)
    return rec, schema


def writers_latency(stdout: str) -> str:
    m = re.search(r"(\d+) ms from handed over to written at p50, (\d+) ms at p87, (\d+) ms at p99", stdout)
    return "/".join(m.groups()) if m else "–"


def latency(summary: dict) -> str:
    lat = summary.get("latency")
    if not lat:
        return "–"
    return f"{lat['p50_ms']:.0f}/{lat['p87_ms']:.0f}/{lat['p99_ms']:.0f}"


def digest_tree(root: Path) -> dict:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            out[str(p.relative_to(root))] = h.hexdigest()
    return out


def compare(args, corpus: Path, keys: Path):
    nfiles, nbytes = corpus_stats(corpus)
    print(f"corpus: {nfiles} files, {nbytes / 1e6:.0f} MB")
    ops = args.ops
    sizes = {"pack": nbytes, "unpack": nbytes}
    if "ingest" in ops:
        recording, schema = ensure_recording()
        recordings = [recording] * args.streams
        sizes["ingest"] = recording.stat().st_size * args.streams
        print(f"ingest: {args.streams} streams of {recording.stat().st_size / 1e6:.0f} MB "
              f"({ROWS} rows of a timestamp and {SENSORS} float32), zstd, BYTE_STREAM_SPLIT")
    contenders = [(s, c) for c in args.cpus for s in args.schedulers]
    walls = {(op, s, c): [] for op in ops for s, c in contenders}
    lats = {(op, s, c): [] for op in ops for s, c in contenders}
    for r in range(args.runs):
        for s, c in contenders:
            shutil.rmtree(OUT, ignore_errors=True)
            OUT.mkdir(parents=True)
            if "pack" in ops or "unpack" in ops:
                warm(corpus)
                wall, summary = run(pack_cmd(corpus, OUT / "packed", keys, s, c))
                if "pack" in ops:
                    walls[("pack", s, c)].append(wall)
                    lats[("pack", s, c)].append(latency(summary))
            if "unpack" in ops:
                wall, summary = run(unpack_cmd(OUT / "packed", OUT / "restored", keys, s, c))
                walls[("unpack", s, c)].append(wall)
                lats[("unpack", s, c)].append(latency(summary))
            if "ingest" in ops:
                warm(recording.parent)
                start = time.perf_counter()
                out = sh(ingest_cmd(recordings, schema, OUT / "ingest", s, c), capture_output=True, text=True)
                walls[("ingest", s, c)].append(time.perf_counter() - start)
                lats[("ingest", s, c)].append(writers_latency(out.stdout))
            print(f"round {r + 1}: {s} --cpu {c}: "
                  + ", ".join(f"{op} {walls[(op, s, c)][-1]:.2f} s" for op in ops), flush=True)
    shutil.rmtree(OUT, ignore_errors=True)
    print(f"\n| operation | --cpu | scheduler | median s (runs) | MB/s | × threads | latency p50/p87/p99 ms (runs) |")
    print("|---|---:|---|---|---:|---:|---|")
    for op in ops:
        for c in args.cpus:
            base = statistics.median(walls[(op, "threads", c)]) if "threads" in args.schedulers else None
            for s in args.schedulers:
                ts = walls[(op, s, c)]
                med = statistics.median(ts)
                ratio = f"{base / med:.3f}" if base else "–"
                print(f"| {op} | {c} | {s} | {med:.2f} ({', '.join(f'{t:.2f}' for t in ts)}) "
                      f"| {sizes[op] / 1e6 / med:.0f} | {ratio} | {'; '.join(lats[(op, s, c)])} |")


def kills(args, corpus: Path, keys: Path):
    tree = WORK / "scheduler-2gb"
    if not tree.exists():
        print("building the 2 GB tree …", file=sys.stderr)
        tree.mkdir(parents=True)
        sh(["cp", "-al", corpus, tree / "corpus"])
        copied = 0
        for p in sorted(corpus.rglob("*")):
            if copied >= 800_000_000:
                break
            if p.is_file() and not p.is_symlink():
                target = tree / "copy" / p.relative_to(corpus)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.link(p, target)
                copied += p.stat().st_size
    nfiles, nbytes = corpus_stats(tree)
    print(f"\nkills: {nfiles} files, {nbytes / 1e6:.0f} MB; pool {args.kill_cpu} workers; "
          f"FORTE_TEST_KILL_WORKERS={args.kill_spec}")
    source = digest_tree(tree)
    results = {}
    for r in range(args.runs):
        for label, env in (("undisturbed", {}), ("killed", {"FORTE_TEST_KILL_WORKERS": args.kill_spec})):
            shutil.rmtree(OUT, ignore_errors=True)
            OUT.mkdir(parents=True)
            warm(tree)
            pw, ps = run(pack_cmd(tree, OUT / "packed", keys, "ordo", args.kill_cpu), env)
            uw, us = run(unpack_cmd(OUT / "packed", OUT / "restored", keys, "ordo", args.kill_cpu), env)
            identical = digest_tree(OUT / "restored") == source
            failed = ps["failed"]  # unpack is all or nothing: a failed file fails the command
            replaced = ps.get("workers_replaced", 0) + us.get("workers_replaced", 0)
            results.setdefault(label, []).append((pw, uw, identical, failed, replaced))
            print(f"round {r + 1}: {label}: pack {pw:.2f} s, unpack {uw:.2f} s, identical {identical}, "
                  f"files failed {failed}, workers replaced {replaced}", flush=True)
    shutil.rmtree(OUT, ignore_errors=True)
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in results.items()}
    for op, i in (("pack", 0), ("unpack", 1)):
        ratio = med["killed"][i] / med["undisturbed"][i]
        print(f"{op}: undisturbed {med['undisturbed'][i]:.2f} s, killed {med['killed'][i]:.2f} s: "
              f"{100 * (ratio - 1):+.1f} %")
    k = results["killed"]
    print(f"killed runs: all identical {all(x[2] for x in k)}; files failed {sum(x[3] for x in k)}; "
          f"workers replaced per run {[x[4] for x in k]}")


def prepare(corpus: Path):
    """Says what runs where, and returns the corpus and the keys, made first if missing."""
    if not FORTE.exists():
        sys.exit(f"{FORTE} is missing: cargo build --release -p forte")
    print(f"machine: {machine()}")
    print(f"command: {' '.join(sys.argv)}")
    keys = WORK / "keys"
    if not keys.exists():
        sh([FORTE, "keygen", "--dir", keys], stdout=subprocess.DEVNULL)
    return ensure_corpus(corpus), keys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cpus", default="1,2", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--schedulers", default="threads,ordo", type=lambda s: s.split(","))
    ap.add_argument("--ops", default="pack,unpack,ingest", type=lambda s: s.split(","))
    ap.add_argument("--streams", type=int, default=4, help="recordings the ingest replays at once")
    ap.add_argument("--kills", action="store_true", help="the workers-killed run instead")
    ap.add_argument("--kill-spec", default="0.6,4")
    ap.add_argument("--kill-cpu", type=int, default=2)
    ap.add_argument("--corpus", type=Path, default=WORK / "corpus")
    args = ap.parse_args()
    corpus, keys = prepare(args.corpus)
    if args.kills:
        kills(args, corpus, keys)
    else:
        compare(args, corpus, keys)


if __name__ == "__main__":
    main()
