#!/usr/bin/env python3
"""Validates the packet-level WAN emulator (`forte-bench wanem`) before any figure is trusted
to it (issue 45): one TCP flow at a time between a namespace and this one, through it.

1. Round trip: `ss -ti` on a flow's sender shows the smoothed RTT for 20, 100, 300 and 600 ms
   (within 5 %). The flow is paced to 2 MB/s, under the link's rate and its window's, so that
   it builds no queue: a flow that fills the link also fills the bottleneck's queue (50 ms at
   the link rate), and its RTT then includes it.
2. Loss: one Reno flow per setting, repeated, against what theory predicts for its round trip
   and loss: Mathis et al. (1.22 / sqrt(p) segments per round trip) and Padhye et al. (with
   retransmission timeouts, which matter from about 1 % on); within 20 %.
3. Rate: one lossless flow at 20 ms fills the link (65 MB/s less the headers: 1448 of every
   1500 bytes), and the emulator's CPU while it does.
4. Ceiling (`--only ceiling`, not run by default): what bare TCP achieves over the long, lossy
   settings of issue 45's targets. A burst of the bytes forte puts on the wire for the 4 GB
   A–N batches, split over 8 or 64 BBR flows opened at once, with no TLS, no requests and no
   application: the share of the 25 MB/s link it fills from its first SYN to its last byte is
   the most any sender on this kernel and link can fill.

Reno because its model is the textbook one (this machine's default is bbr, which random loss
does not slow; CUBIC is Reno-friendly only at short round trips).

Usage (root, after `cargo build --release -p forte-bench`): bench/wanem_validate.py [--runs 3] [--seconds 30]
"""

import argparse
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from network import cpu_seconds

ROOT = Path(__file__).resolve().parent.parent
WANEM = ROOT / "target/release/forte-bench"
FLOW = ROOT / "bench/tcp_flow.py"
NS = "wanem-check"
MSS = 1448  # 1500 less IP (20), TCP (20) and timestamps (12)


class Link:
    def __init__(self, rtt_ms, loss, rate="65MB"):
        self.args = ["--rtt", f"{rtt_ms}ms", "--loss", str(loss), "--rate", rate]

    def __enter__(self):
        self.proc = subprocess.Popen([WANEM, "wanem", "--namespaces", NS, ".", "--device", "wanchk0", *self.args],
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        if not line.startswith("wanem:"):
            sys.exit(f"the emulator did not start: {line}")
        return self

    def __exit__(self, *_):
        self.proc.terminate()
        self.proc.wait()


def flow(seconds, cc, probe_at=None, rate=None):
    """One flow from the namespace to here: (goodput MB/s, the sender's `ss -ti` at probe_at s)."""
    server = subprocess.Popen([sys.executable, FLOW, "server"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    client = subprocess.Popen(["ip", "netns", "exec", NS, sys.executable, FLOW, "client", str(seconds), cc,
                               *([str(rate)] if rate else [])])
    ss = ""
    if probe_at:
        time.sleep(probe_at)
        ss = subprocess.run(["ip", "netns", "exec", NS, "ss", "-ti", "dst", "10.77.0.2"],
                            capture_output=True, text=True).stdout
    client.wait()
    out = server.communicate()[0]
    return float(re.search(r"([\d.]+) MB/s", out).group(1)), ss


def burst(flows, size, cc="bbr"):
    """FLOWS connections from the namespace send SIZE bytes between them: (seconds from the first
    SYN to the last byte, bytes the link carried meanwhile, headers and retransmissions too)."""
    sink = subprocess.Popen([sys.executable, FLOW, "sink", str(flows)], stdout=subprocess.PIPE, text=True)
    assert sink.stdout.readline().strip() == "listening"
    link = Path("/sys/class/net/wanchk0/statistics/rx_bytes")
    before = int(link.read_text())
    sender = subprocess.run(["ip", "netns", "exec", NS, sys.executable, FLOW, "burst", str(flows), str(size), cc],
                            capture_output=True, text=True, check=True).stdout
    out = sink.communicate()[0]
    began = float(re.search(r"began at ([\d.]+)", sender).group(1))
    ended = float(re.search(r"last at ([\d.]+)", out).group(1))
    return ended - began, int(link.read_text()) - before


def padhye(rtt, p, rto):
    """Segments per second (Padhye et al. 1998, b = 1: Linux counts acknowledged bytes)."""
    return 1 / (rtt * math.sqrt(2 * p / 3) + rto * min(1, 3 * math.sqrt(3 * p / 8)) * p * (1 + 32 * p * p))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--only", default="rtt,loss,rate", help="which checks (rtt, loss, rate, ceiling), comma-separated")
    args = ap.parse_args()
    only = args.only.split(",")
    subprocess.run(["ip", "netns", "del", NS], stderr=subprocess.DEVNULL)
    subprocess.run(["ip", "netns", "add", NS], check=True)
    try:
        print("| round trip set | smoothed RTT (ss -ti) | off by |\n|---:|---:|---:|")
        for rtt in [20, 100, 300, 600] if "rtt" in only else []:
            with Link(rtt, 0, "20MB"):
                _, ss = flow(6, "cubic", probe_at=4, rate=2_000_000)
            srtt = float(re.search(r"\brtt:([\d.]+)/", ss).group(1))
            print(f"| {rtt} ms | {srtt:.1f} ms | {(srtt - rtt) / rtt * 100:+.1f} % |", flush=True)

        print("\n| Reno flow | measured MB/s (median; runs) | Mathis | Padhye (RTO = RTT + 200 ms) | "
              "off by (Mathis, Padhye) |\n|---|---:|---:|---:|---:|")
        for rtt_ms, p in [(20, 0.0001), (100, 0.001), (200, 0.01)] if "loss" in only else []:
            with Link(rtt_ms, p):
                got = [flow(args.seconds, "reno")[0] for _ in range(args.runs)]
            rtt = rtt_ms / 1000
            mathis = MSS / rtt * 1.22 / math.sqrt(p) / 1e6
            pftk = MSS * padhye(rtt, p, rtt + 0.2) / 1e6
            m = statistics.median(got)
            print(f"| {rtt_ms} ms, {p * 100:g} % loss | {m:.3f} ({', '.join(f'{g:.3f}' for g in got)}) | "
                  f"{mathis:.3f} | {pftk:.3f} | {(m - mathis) / mathis * 100:+.0f} %, "
                  f"{(m - pftk) / pftk * 100:+.0f} % |", flush=True)

        if "ceiling" in only:
            size = 1_314_833_288  # forte's wire bytes for the 4 GB A–N batches (wan-25mb-4gb.json)
            print("\n| 25 MB/s link, a burst of 1.31 GB | BBR flows | seconds (runs) | share of the link filled "
                  "(median) |\n|---|---:|---:|---:|")
            for rtt_ms, p in [(20, 0), (300, 0.001), (600, 0.001), (600, 0.01)]:
                for flows in [8, 64]:
                    with Link(rtt_ms, p, "25MB"):
                        got = [burst(flows, size) for _ in range(args.runs)]
                    shares = [wire / secs / 25e6 for secs, wire in got]
                    print(f"| {rtt_ms} ms, {p * 100:g} % loss | {flows} | "
                          f"{', '.join(f'{secs:.1f}' for secs, _ in got)} | {statistics.median(shares) * 100:.0f} % "
                          f"({', '.join(f'{x * 100:.0f}' for x in shares)}) |", flush=True)

        if "rate" not in only:
            return
        print("\n| lossless, 20 ms, 65 MB/s | goodput MB/s (runs) | expected | emulator CPU |\n|---|---:|---:|---:|")
        with Link(20, 0) as link:
            before, started = cpu_seconds(link.proc.pid), time.monotonic()
            got = [flow(10, "cubic")[0] for _ in range(args.runs)]
            cpu = (cpu_seconds(link.proc.pid) - before) / (time.monotonic() - started)
        print(f"| one CUBIC flow, 10 s | {statistics.median(got):.1f} ({', '.join(f'{g:.1f}' for g in got)}) | "
              f"≤ {65 * MSS / 1500:.1f} | {cpu * 100:.0f} % of a core |")
    finally:
        subprocess.run(["ip", "netns", "del", NS])


if __name__ == "__main__":
    main()
