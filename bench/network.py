#!/usr/bin/env python3
"""Edge → relay → core end to end, on the FORTE test set's shape, over an emulated site link.

Builds 14 batches A–N with sizes proportional to the papers' (337 GB scaled by --scale, default
1/1000 → 337 MB): bag-like files of up to 8 MB cut from real files (system libraries,
toolchain, text; the bench/prepare.py corpus) plus a ~350 kB text log per batch. Runs a relay,
`forte pull --watch` and `forte send` and measures:

- delivery: every file arrives byte-identical under {site}/{batch}/{path}; the core's catalogue
  shows every file acknowledged with its SHA-256, every part verified with its raw and ciphertext
  SHA-256, and the pull stage's start and end for every batch;
- throughput: effective raw-data rate = raw bytes / (send start → last delivery), against
  min(link rate × compression ratio, `forte pack` rate), all in one invocation.

With --link-rate (e.g. 65MB, the papers' site link) and root, the sender runs in a network
namespace behind a veth pair whose egress is shaped by a tbf qdisc; otherwise everything runs
on loopback.

Usage (as root for --link-rate): bench/network.py [--link-rate 65MB] [--scale 0.001]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from corpus import BATCHES, build_inbox
from site_setup import make_site, start_relay
from binary import FORTE

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("FORTE_BENCH_DIR", "/tmp/forte-bench")) / "network"
NS = "forte-site"


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User + system CPU time of a running process (its threads included; with `children`,
    also its children that have exited and been waited for), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


def parse_rate(text: str) -> float:
    units = {"KB": 1e3, "MB": 1e6, "GB": 1e9}
    for u, f in units.items():
        if text.upper().endswith(u):
            return float(text[: -len(u)]) * f
    return float(text)


def setup_link(rate: float):
    teardown_link()
    sh(["ip", "netns", "add", NS])
    sh(["ip", "link", "add", "veth-dc", "type", "veth", "peer", "name", "veth-site"])
    sh(["ip", "link", "set", "veth-site", "netns", NS])
    sh(["ip", "addr", "add", "10.77.0.2/24", "dev", "veth-dc"])
    sh(["ip", "link", "set", "veth-dc", "up"])
    sh(["ip", "netns", "exec", NS, "ip", "addr", "add", "10.77.0.1/24", "dev", "veth-site"])
    sh(["ip", "netns", "exec", NS, "ip", "link", "set", "veth-site", "up"])
    sh(["ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up"])
    shape_link("add", rate)


def set_link_rate(rate: float):
    """Changes the rate of the link `setup_link` made, while traffic crosses it."""
    shape_link("change", rate)


def shape_link(verb: str, rate: float):
    mbit = rate * 8 / 1e6
    sh(["ip", "netns", "exec", NS, "tc", "qdisc", verb, "dev", "veth-site", "root", "tbf",
        "rate", f"{mbit:.0f}mbit", "burst", "1mb", "latency", "100ms"])


def teardown_link():
    subprocess.run(["ip", "netns", "del", NS], stderr=subprocess.DEVNULL)
    subprocess.run(["ip", "link", "del", "veth-dc"], stderr=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--link-rate", help="shape the site link, e.g. 65MB (needs root)")
    ap.add_argument("--scale", type=float, default=0.001)
    ap.add_argument("--connections", type=int, default=4, help="send's concurrent uploads")
    ap.add_argument("--pull-cpu", type=int, help="CPU budget of the puller (default: all cores)")
    ap.add_argument("--level", default="3", help="zstd level of pack and send (a number, or auto)")
    ap.add_argument("--drop-caches", action="store_true",
                    help="free the page cache before the transfer (root): on a VM, page cache growing into "
                         "never-touched memory makes every written page fault on the host")
    ap.add_argument("--pull-after", action="store_true",
                    help="start the puller only after send finished (measures the edge leg alone)")
    args = ap.parse_args()

    sh(["cargo", "build", "--release", "-q"], cwd=ROOT)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    inbox = WORK / "inbox"
    raw = build_inbox(inbox, args.scale)
    nfiles = sum(1 for p in inbox.rglob("*") if p.is_file() and p.name != ".ready")
    print(f"inbox: 14 batches, {nfiles} files, {raw / 1e6:.0f} MB", file=sys.stderr)
    make_site(FORTE, WORK, "mine")

    # The baseline of the same invocation: forte pack of the same inbox, to tmpfs.
    out = Path("/dev/shm/forte-bench-network-pack")
    shutil.rmtree(out, ignore_errors=True)
    pack = json.loads(subprocess.run([FORTE, "pack", inbox, "--to", out, "--level", str(args.level),
                                      "--recipient", WORK / "keys/core.pub",
                                      "--sign", WORK / "keys/edge.key", "--json", "-q"],
                                     check=True, capture_output=True, text=True).stdout)
    shutil.rmtree(out, ignore_errors=True)
    pack_rate = pack["raw_mb_per_s"] * 1e6

    if args.drop_caches:
        sh(["sync"])
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    shaped = bool(args.link_rate)
    host = "10.77.0.2" if shaped else "127.0.0.1"
    if shaped:
        setup_link(parse_rate(args.link_rate))
    relay = None
    try:
        relay, url, fingerprint = start_relay(FORTE, WORK / "relay", WORK / "tokens.toml", f"{host}:0")
        conn = ["--relay", url, "--relay-fingerprint", fingerprint, "--token-file"]
        core_cat = WORK / "core.sqlite"
        dest = WORK / "dest"
        start_puller = lambda: subprocess.Popen([FORTE, "--catalog", core_cat, "pull", "--watch", "--interval", "1", "--to", dest,
                                   "--identity", WORK / "keys/core.key", "--trust", f"mine={WORK / 'keys/edge.pub'}",
                                   *(["--cpu", str(args.pull_cpu)] if args.pull_cpu else []),
                                   *conn, WORK / "core.token", "-q"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        puller = None if args.pull_after else start_puller()
        send = [FORTE, "--catalog", WORK / "edge.sqlite", "send", inbox, "--recipient", WORK / "keys/core.pub",
                "--sign", WORK / "keys/edge.key", "--site", "mine", *conn, WORK / "edge.token", "--connections", str(args.connections),
                "--level", str(args.level),
                "--json", "-q"]
        if shaped:
            send = ["ip", "netns", "exec", NS, *send]
        start = time.monotonic()
        children_before = os.times()
        sent = json.loads(subprocess.run(send, check=True, capture_output=True, text=True).stdout)
        sent_at = time.monotonic() - start
        children_after = os.times()
        send_cpu = (children_after.children_user + children_after.children_system
                    - children_before.children_user - children_before.children_system)
        puller = puller or start_puller()
        # Delivered files appear only under dest/mine (staging lives beside it and vanishes).
        delivered_files = lambda: sum(len(files) for _, _, files in os.walk(dest / "mine"))
        while delivered_files() < nfiles:
            time.sleep(0.2)
        elapsed = time.monotonic() - start
        # Let the puller finish acknowledging before stopping it: the relay empties.
        objects = WORK / "relay" / "sites" / "mine" / "objects"
        while any(objects.iterdir()):
            time.sleep(0.2)
        pull_cpu = cpu_seconds(puller.pid)
        relay_cpu = cpu_seconds(relay.pid)
        puller.terminate()
        puller.wait()
    finally:
        if relay:
            relay.terminate()
            relay.wait()
        if shaped:
            teardown_link()

    for name, _ in BATCHES:
        sh(["diff", "-r", "-x", ".ready", inbox / f"batch-{name}", dest / "mine" / f"batch-{name}"])
    status = json.loads(subprocess.run([FORTE, "--catalog", core_cat, "status", "--json"], check=True,
                                       capture_output=True, text=True).stdout)["batches"]
    files = [f for b in status for f in b["files"]]
    assert len(status) == 14 and all(b["batch"]["state"] == "delivered" for b in status), [b["batch"]["state"] for b in status]
    assert len(files) == nfiles and all(f["state"] == "acknowledged" and len(f["raw_sha256"]) == 64 for f in files), \
        "every file acknowledged with its SHA-256"
    assert all(any(s["stage"] == "pull" and s["ended_at"] for s in b["stages"]) for b in status)
    parts = subprocess.run([FORTE, "--catalog", core_cat, "status", "--file", files[0]["delivered_to"], "--json"],
                           check=True, capture_output=True, text=True).stdout
    assert '"ciphertext_sha256": "' in parts and '"verified"' in parts

    sealed = sum(b["sealed_bytes"] for b in sent["batches"])
    ratio = raw / sealed
    effective = raw / elapsed
    link = parse_rate(args.link_rate) if shaped else float("inf")
    bound = min(link * ratio, pack_rate)
    print(f"\nmachine: {os.cpu_count()} cores; link: {args.link_rate or 'loopback (unshaped)'}; "
          f"{nfiles} files in 14 batches, {raw / 1e6:.0f} MB raw, {sealed / 1e6:.0f} MB sealed (ratio {ratio:.2f})")
    print("| measure | value |")
    print("|---|---:|")
    print(f"| forte pack rate (same data, tmpfs) | {pack_rate / 1e6:.1f} MB/s |")
    if shaped:
        print(f"| link rate × compression ratio | {link * ratio / 1e6:.1f} MB/s |")
    print(f"| send finished after | {sent_at:.1f} s |")
    print(f"| last file delivered after | {elapsed:.1f} s |")
    print(f"| effective raw-data rate delivered | {effective / 1e6:.1f} MB/s |")
    print(f"| ratio to min(link × ratio, pack rate) | {effective / bound:.2f} |")
    print(f"| CPU seconds: send / relay / pull | {send_cpu:.1f} / {relay_cpu:.1f} / {pull_cpu:.1f} "
          f"(of {os.cpu_count() * elapsed:.0f} available) |")
    print("\nverified: every file byte-identical under {site}/{batch}/{path} (diff -r); the core catalogue has 14 "
          "batches delivered with pull stage times, every file acknowledged with its SHA-256, parts verified "
          "with raw and ciphertext SHA-256")


if __name__ == "__main__":
    main()
