#!/usr/bin/env python3
"""What each scheduler would do on 12, 16 and 64 cores (issue 20): a model fed with what one
pack and one unpack of the corpus measure here.

Measured (release build, --cpu 1, each scheduler, the corpus of bench/corpus.py): every stage's
busy seconds per item (`--json` stages: busy_seconds / items_in), the run's wall time and its
latency percentiles. From them, per operation:

  C        CPU seconds per part, every stage together (read and sink included: their threads
           compute too: copies, writes)
  S        the busiest serial stage's seconds per part: the read stage (one reader) and the
           raw hash (one file's parts in order, one at a time: `workers` 1)

Throughput on N cores (parts per second) = min(N / C, 1 / S): the cores, or the serial
stage, whichever binds first. Latency from read to sink ≈ (items in flight) / throughput
(Little's law), with items in flight: threads and rayon read ahead to the memory budget
(parts_in_flight = N + 4); ordo reads when its queues hold fewer than N items, so N wait and
those being worked on are in flight: N when the cores bind, 1 when a serial stage does (the
others have nothing to do).

The per-stage costs are each scheduler's own: a stage's busy time is the wall time its
workers spent on items, so the time a worker was descheduled for another thread (threads runs
more threads than cores) is in it.

Usage: bench/scheduler_model.py [--cores 2,12,16,64]
"""

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scheduler import OUT, WORK, pack_cmd, prepare, run, unpack_cmd, warm  # noqa: E402

SERIAL = {"read", "hash"}


def measure(corpus: Path, keys: Path, scheduler: str):
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    warm(corpus)
    out = {}
    wall, summary = run(pack_cmd(corpus, OUT / "packed", keys, scheduler, 1))
    out["pack"] = (wall, summary)
    wall, summary = run(unpack_cmd(OUT / "packed", OUT / "restored", keys, scheduler, 1))
    out["unpack"] = (wall, summary)
    shutil.rmtree(OUT, ignore_errors=True)
    return out


def constants(wall: float, summary: dict):
    stages = summary["stages"]
    # Parts: what the stage after the first takes (the first takes objects at the edge).
    parts = max(s["items_in"] for s in stages if s["item"] == "part")
    per = {s["name"]: s["busy_seconds"] / parts for s in stages}
    cpu = sum(per.values())
    serial = max(v for k, v in per.items() if k in SERIAL)
    return parts, cpu, serial, per


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cores", default="2,12,16,64", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--corpus", type=Path, default=WORK / "corpus")
    args = ap.parse_args()
    corpus, keys = prepare(args.corpus)
    measured = {s: measure(corpus, keys, s) for s in ("threads", "rayon", "ordo")}
    for op in ("pack", "unpack"):
        print(f"\n{op}, measured at --cpu 1:")
        for s, m in measured.items():
            wall, summary = m[op]
            parts, cpu, serial, per = constants(wall, summary)
            lat = summary["latency"]
            stages = ", ".join(f"{k} {1e3 * v:.1f}" for k, v in per.items())
            print(f"  {s}: {parts} parts, wall {wall:.2f} s; ms per part: {stages}; "
                  f"C {1e3 * cpu:.1f} ms, S {1e3 * serial:.1f} ms; "
                  f"latency p50/p87/p99 {lat['p50_ms']:.0f}/{lat['p87_ms']:.0f}/{lat['p99_ms']:.0f} ms")
        print(f"\n| {op}: cores | scheduler | parts/s | MB/s (raw) | bound by | in flight | latency ≈ ms |")
        print("|---:|---|---:|---:|---|---:|---:|")
        raw_mb = measured["threads"][op][1]["stages"][0]["bytes_in"] / 1e6
        for n in args.cores:
            for s, m in measured.items():
                wall, summary = m[op]
                parts, cpu, serial, _ = constants(wall, summary)
                by_cores = n / cpu
                by_serial = 1 / serial
                rate = min(by_cores, by_serial)
                working = n if by_cores < by_serial else 1
                flight = n + working if s == "ordo" else n + 4
                latency = flight / rate * 1e3
                print(f"| {n} | {s} | {rate:.0f} | {rate * raw_mb / parts:.0f} "
                      f"| {'cores' if by_cores < by_serial else 'serial stage (read or raw hash)'} "
                      f"| {flight} | {latency:.0f} |")


if __name__ == "__main__":
    main()
