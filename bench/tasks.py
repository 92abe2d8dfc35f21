#!/usr/bin/env python3
"""What a site's per-file task costs at the core, with many small files (issue 21).

One batch of --files small files (1-20 kB) is sent to a relay on loopback once; then it is
pulled --runs times by each contender, interleaved, from a copy of the relay's store taken
before the first pull (so every pull finds the same sealed batch): `forte pull` without tasks,
and with a core task per file that does nothing (`/bin/true`: the cost is forte's, starting a
process and recording its try) at --concurrency 1 and 4. Reports the median pull time, files
per second and the task's cost per file.

Usage: bench/tasks.py [--files 2000] [--runs 3]
"""

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from binary import FORTE  # noqa: E402
from site_setup import make_site, start_relay  # noqa: E402

WORK = Path(os.environ.get("FORTE_BENCH_DIR", "/tmp/forte-bench")) / "tasks"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    batch = WORK / "inbox" / "small"
    batch.mkdir(parents=True)
    rng = random.Random(1)
    for i in range(args.files):
        (batch / f"f{i:05d}.dat").write_bytes(os.urandom(rng.randint(1_000, 20_000)))
    (batch / ".ready").touch()
    make_site(FORTE, WORK, "site")
    relay, url, fingerprint = start_relay(FORTE, WORK / "relay", WORK / "tokens.toml", "127.0.0.1:0")
    conn = ["--relay", url, "--relay-fingerprint", fingerprint, "--token-file"]
    try:
        subprocess.run([FORTE, "--catalog", WORK / "edge.sqlite", "send", WORK / "inbox", "-q",
                        "--recipient", WORK / "keys/core.pub", "--sign", WORK / "keys/edge.key",
                        "--site", "site", *conn, WORK / "edge.token"], check=True)
    finally:
        relay.terminate()
        relay.wait()
    shutil.copytree(WORK / "relay", WORK / "relay-sent", symlinks=True)
    contenders = {"no task": None, "per-file task, concurrency 1": 1, "per-file task, concurrency 4": 4}
    times = {name: [] for name in contenders}
    for r in range(args.runs):
        for name, concurrency in contenders.items():
            for d in ("relay", "dest", "core.sqlite", "core.sqlite-wal", "core.sqlite-shm"):
                p = WORK / d
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
            shutil.copytree(WORK / "relay-sent", WORK / "relay", symlinks=True)
            config = WORK / "forte.toml"
            text = ""
            if concurrency:
                text = (f'[[task]]\nname = "nothing"\nat = "core"\nper = "file"\n'
                        f'command = ["/bin/true"]\nconcurrency = {concurrency}\n')
            config.write_text(text)
            relay, url, fingerprint = start_relay(FORTE, WORK / "relay", WORK / "tokens.toml", "127.0.0.1:0")
            try:
                start = time.perf_counter()
                subprocess.run([FORTE, "--config", config, "--catalog", WORK / "core.sqlite", "pull",
                                "--to", WORK / "dest", "-q", "--identity", WORK / "keys/core.key",
                                "--trust", f"site={WORK / 'keys/edge.pub'}", "--relay", url,
                                "--relay-fingerprint", fingerprint, "--token-file", WORK / "core.token"],
                               check=True, stdout=subprocess.DEVNULL)
                times[name].append(time.perf_counter() - start)
            finally:
                relay.terminate()
                relay.wait()
            got = sum(1 for _ in (WORK / "dest").rglob("*.dat"))
            assert got == args.files, f"{name}: {got} of {args.files} files delivered"
            print(f"round {r + 1}: {name}: {times[name][-1]:.2f} s", flush=True)
    base = statistics.median(times["no task"])
    print(f"\n{args.files} files of 1-20 kB in one batch; median of {args.runs} pulls, interleaved\n")
    print("| pull | median s (runs) | files/s | task cost per file |")
    print("|---|---|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        cost = "–" if name == "no task" else f"{(med - base) / args.files * 1e3:.2f} ms"
        print(f"| {name} | {med:.2f} ({', '.join(f'{t:.2f}' for t in ts)}) | {args.files / med:.0f} | {cost} |")
    shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
