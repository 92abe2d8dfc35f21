#!/usr/bin/env python3
"""Queue policies side by side: the convoy effect of FIFO and what SJF and SJF-with-aging do.

The 14 batches A–N of the FORTE test set (sizes proportional to the papers', scaled by
--scale) arrive one every --gap seconds in the papers' order (A first, I the large one),
while a watching sender, a relay and a watching puller run. The sender sits in a network
namespace behind a tbf-shaped veth link (--link-rate), slow enough that the link is the
bottleneck. For each policy the run's KPIs come from `forte report` on the edge and core
catalogues: batch latency l_b split into queueing and processing, R_P, the link's use while
batches waited, and a timeline chart (docs/policies/<policy>/timeline.png).

Usage (root: network namespaces and tc):
    bench/policies.py [--link-rate 10MB] [--scale 0.0035] [--gap 1] [--max-wait 15s]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import BATCHES, build_inbox  # noqa: E402
from network import FORTE, NS, ROOT, parse_rate, setup_link, sh, teardown_link  # noqa: E402
from site_setup import make_site, start_relay  # noqa: E402

WORK = Path(os.environ.get("FORTE_BENCH_DIR", "/tmp/forte-bench")) / "policies"


def run_policy(policy, args, source, nfiles):
    run = WORK / policy
    shutil.rmtree(run, ignore_errors=True)
    inbox, dest = run / "inbox", run / "dest"
    inbox.mkdir(parents=True)
    schedule = ["--policy", policy, "--max-wait", args.max_wait]
    relay, url, fingerprint = start_relay(FORTE, run / "relay", WORK / "tokens.toml", "10.77.0.2:0")
    procs = []
    try:
        conn = ["--relay", url, "--relay-fingerprint", fingerprint, "--token-file"]
        procs.append(subprocess.Popen(
            [FORTE, "--catalog", run / "core.sqlite", "pull", "--watch", "--interval", "1", "--to", dest,
             "--identity", WORK / "keys/core.key", "--trust", f"mine={WORK / 'keys/edge.pub'}", *schedule,
             *conn, WORK / "core.token"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", NS, FORTE, "--catalog", run / "edge.sqlite", "send", inbox, "--watch",
             "--interval", "1", "--recipient", WORK / "keys/core.pub", "--sign", WORK / "keys/edge.key",
             "--site", "mine", *schedule, *conn, WORK / "edge.token"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        # Arrivals: a batch appears complete (hard-linked copy moved in, then its marker).
        for i, (name, _) in enumerate(BATCHES):
            staged = run / f"arriving-{name}"
            sh(["cp", "-al", source / f"batch-{name}", staged])
            (staged / ".ready").unlink(missing_ok=True)
            os.rename(staged, inbox / f"batch-{name}")
            (inbox / f"batch-{name}" / ".ready").touch()
            if i + 1 < len(BATCHES):
                time.sleep(args.gap)
        delivered = lambda: sum(len(f) for _, _, f in os.walk(dest / "mine")) if (dest / "mine").exists() else 0
        deadline = time.monotonic() + 1800
        while delivered() < nfiles:
            if time.monotonic() > deadline:
                raise SystemExit(f"{policy}: not everything delivered in 30 minutes")
            time.sleep(0.5)
        time.sleep(1.5)  # the last utilisation samples and catalogue records
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        relay.terminate()
        relay.wait()
    for name, _ in BATCHES:
        sh(["diff", "-r", "-x", ".ready", source / f"batch-{name}", dest / "mine" / f"batch-{name}"])
    charts = ROOT / "docs" / "policies" / policy
    report = json.loads(subprocess.run(
        [FORTE, "--catalog", run / "edge.sqlite", "report", "--with", run / "core.sqlite", "--format", "json",
         "--link-rate", args.link_rate, "--nominal-rate", "3.36TB/day", "--charts", charts,
         "--title", f"policy {policy}, {args.link_rate}/s link"],
        check=True, capture_output=True, text=True).stdout)
    text = subprocess.run(
        [FORTE, "--catalog", run / "edge.sqlite", "report", "--with", run / "core.sqlite",
         "--link-rate", args.link_rate, "--nominal-rate", "3.36TB/day"],
        check=True, capture_output=True, text=True).stdout
    (charts / "report.txt").write_text(text)
    return report


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--link-rate", default="10MB")
    ap.add_argument("--scale", type=float, default=0.0035)
    ap.add_argument("--gap", type=float, default=1.0, help="seconds between batch arrivals")
    ap.add_argument("--max-wait", default="15s")
    ap.add_argument("--policies", default="fifo,sjf,sjf-aging")
    args = ap.parse_args()

    sh(["cargo", "build", "--release", "-q"], cwd=ROOT)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    source = WORK / "source"
    raw = build_inbox(source, args.scale)
    nfiles = sum(1 for p in source.rglob("*") if p.is_file() and p.name != ".ready")
    print(f"14 batches, {nfiles} files, {raw / 1e6:.0f} MB raw", file=sys.stderr)
    make_site(FORTE, WORK, "mine")

    setup_link(parse_rate(args.link_rate))
    reports = {}
    try:
        for policy in args.policies.split(","):
            print(f"running {policy} …", file=sys.stderr)
            reports[policy] = run_policy(policy, args, source, nfiles)
    finally:
        teardown_link()

    max_wait = float(args.max_wait.rstrip("s"))
    late = {"J", "K", "L", "M", "N"}
    print(f"\nmachine: {os.cpu_count()} cores; link {args.link_rate}/s (tbf); {raw / 1e6:.0f} MB raw in 14 batches "
          f"arriving {args.gap:g} s apart (A…N); --max-wait {args.max_wait}\n")
    print("| policy | mean l_b | vs fifo | max l_b (batch) | I: l_b / q_send / rest | J–N queueing share | R_P | link ≥ 90 % while waiting | daily capacity |")
    print("|---|---:|---:|---|---|---:|---:|---:|---|")
    fifo_mean = None
    for policy, r in reports.items():
        batches = r["batches"]
        run = r["run"]
        mean = run["mean_latency_s"]
        fifo_mean = fifo_mean or (mean if policy == "fifo" else None)
        worst = max(batches, key=lambda b: b["latency_s"])
        big = next(b for b in batches if b["name"] == "batch-I")
        q_send = big["stages"][0]["started"] - big["stages"][0]["queued_from"]
        rest = big["latency_s"] - q_send / 1e6
        jn = [b for b in batches if b["name"][-1] in late]
        share = sum(b["queueing_s"] for b in jn) / sum(b["latency_s"] for b in jn)
        link = r["link"]
        print(f"| {policy} | {mean:.1f} s | {'' if fifo_mean is None else f'{100 * (mean / fifo_mean - 1):+.0f} %'} "
              f"| {worst['latency_s']:.1f} s ({worst['name'][-1]}) "
              f"| {big['latency_s']:.1f} / {q_send / 1e6:.1f} / {rest:.1f} s "
              f"| {100 * share:.0f} % | {run['rate_mb_s']:.1f} MB/s "
              f"| {100 * link['share_at_90_percent']:.0f} % of {link['samples']} s (median {100 * link['median_share_of_link']:.0f} %) "
              f"| {r['verdict']} |")
    print(f"\nsjf-aging bound for I: q_send ≤ --max-wait ({max_wait:g} s) + one file's pipeline lag")
    print("every batch byte-identical under {site}/{batch}/{path} (diff -r) in every run; charts and text "
          "reports in docs/policies/<policy>/")


if __name__ == "__main__":
    main()
