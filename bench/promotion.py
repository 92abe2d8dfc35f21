#!/usr/bin/env python3
"""What checking a landed batch before promotion costs (issue 42): the A–N batches (times
--scale) are sent once to a relay on loopback; then they are pulled --runs times by each
contender, interleaved, from a copy of the relay's store taken before the first pull, with a
core task per batch that does nothing (`/bin/true`), so every batch lands, is checked and is
promoted:

  base      FORTE_BASE_BINARY: a build without the check (promotion moves the landing
            directory as it is)
  check     this tree's build (or FORTE_BINARY): files made read-only, identities recorded,
            and after the task every file's metadata compared, hashing only what moved
  hash all  the bytes the check would read if it hashed every file again: `sha256sum` over the
            delivered files, timed on its own after each `check` pull (the alternative the
            check avoids)

Reports the median pull time of each, and the check's cost against base.

Usage: FORTE_BASE_BINARY=... bench/promotion.py [--scale 0.003] [--runs 5]
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from binary import FORTE  # noqa: E402
from corpus import build_inbox  # noqa: E402
from site_setup import make_site, start_relay  # noqa: E402

WORK = Path(os.environ.get("FORTE_BENCH_DIR", "/tmp/forte-bench")) / "promotion"


def pull(forte, config, log=None):
    """One pull of everything the relay holds, from a fresh copy of the sent store; its
    standard error to `log` if given."""
    for d in ("relay", "dest", "core.sqlite", "core.sqlite-wal", "core.sqlite-shm"):
        p = WORK / d
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    shutil.copytree(WORK / "relay-sent", WORK / "relay", symlinks=True)
    relay, url, fingerprint = start_relay(forte, WORK / "relay", WORK / "tokens.toml", "127.0.0.1:0")
    try:
        start = time.perf_counter()
        subprocess.run([forte, "--config", config, "--catalog", WORK / "core.sqlite", "pull",
                        "--to", WORK / "dest", "-q", "--identity", WORK / "keys/core.key",
                        "--trust", f"site={WORK / 'keys/edge.pub'}", "--receipt-key", WORK / "keys/receipt.key",
                        "--relay", url,
                        "--relay-fingerprint", fingerprint, "--token-file", WORK / "core.token"],
                       check=True, stdout=subprocess.DEVNULL,
                       stderr=open(log, "w") if log else None,
                       env={**os.environ, "FORTE_LOG": "info,forte_core=debug"} if log else None)
        return time.perf_counter() - start
    finally:
        relay.terminate()
        relay.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=0.003)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    base = Path(os.environ["FORTE_BASE_BINARY"])
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    raw = build_inbox(WORK / "inbox", args.scale)
    make_site(FORTE, WORK, "site")
    relay, url, fingerprint = start_relay(FORTE, WORK / "relay", WORK / "tokens.toml", "127.0.0.1:0")
    try:
        subprocess.run([FORTE, "--catalog", WORK / "edge.sqlite", "send", WORK / "inbox", "-q",
                        "--recipient", WORK / "keys/core.pub", "--sign", WORK / "keys/edge.key",
                        "--site", "site", "--relay", url, "--relay-fingerprint", fingerprint,
                        "--token-file", WORK / "edge.token"], check=True)
    finally:
        relay.terminate()
        relay.wait()
    shutil.copytree(WORK / "relay", WORK / "relay-sent", symlinks=True)
    config = WORK / "forte.toml"
    config.write_text('[[task]]\nname = "nothing"\nat = "core"\nper = "batch"\ncommand = ["/bin/true"]\n')
    times = {"base": [], "check": [], "hash all": []}
    own = []
    for r in range(args.runs):
        times["base"].append(pull(base, config))
        log = WORK / "check.log"
        times["check"].append(pull(FORTE, config, log))
        spent = [float(m) for m in re.findall(r"(?:protect|check)_ms=([\d.]+)", log.read_text())]
        own.append(sum(spent) / 1e3)
        files = [str(p) for p in (WORK / "dest").rglob("*") if p.is_file()]
        start = time.perf_counter()
        subprocess.run(["sha256sum", *files], check=True, stdout=subprocess.DEVNULL)
        times["hash all"].append(time.perf_counter() - start)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
    b, c, h = (statistics.median(times[k]) for k in ("base", "check", "hash all"))
    print(f"\nA–N at scale {args.scale}: {raw / 1e6:.0f} MB in 14 batches; a core task per batch; "
          f"median of {args.runs} pulls, interleaved\n")
    print("| contender | median s (runs) |")
    print("|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts):.2f} ({', '.join(f'{t:.2f}' for t in ts)}) |")
    print(f"\ncheck / base: {c / b:.3f} ({(c - b):+.2f} s); the check's own time, from its log lines: "
          f"median {statistics.median(own):.3f} s per pull ({', '.join(f'{t:.3f}' for t in own)}); "
          f"hashing everything again would add {h:.2f} s ({h / b * 100:.0f} % of base)")
    shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
