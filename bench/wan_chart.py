#!/usr/bin/env python3
"""Draws `bench/wan.py --json` results as rate against round trip, a panel per loss, a line
per contender (median of each setting's runs).

Usage: bench/wan_chart.py RESULTS.json OUT.svg [--wire] [--title TEXT] [--table]
  --wire: the rate on the link (bytes on the wire per second) instead of the effective raw rate
  --table: also print a Markdown table of every setting: each contender's median time, its
           rate on the link (and the share of the link's rate), the best 5-s window on the
           link, forte's time against each other contender's, and CPU-seconds per GB by role
"""

import argparse
import json
import statistics
from pathlib import Path

from chart import line_panels


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--wire", action="store_true")
    ap.add_argument("--title")
    ap.add_argument("--table", action="store_true")
    args = ap.parse_args()
    settings = json.loads(args.results.read_text())
    rtts = sorted({s["rtt_ms"] for s in settings})
    losses = sorted({s["loss"] for s in settings})
    names = list(dict.fromkeys(n for s in settings for n in s["contenders"]))
    panels = []
    for loss in losses:
        series = {}
        for name in names:
            ys = []
            for rtt in rtts:
                s = next((s for s in settings if s["rtt_ms"] == rtt and s["loss"] == loss), None)
                runs = s["contenders"].get(name) if s else None
                if not runs:
                    ys.append(None)
                    continue
                seconds = statistics.median(r["seconds"] for r in runs)
                amount = statistics.median(r["wire_bytes"] for r in runs) if args.wire else s["raw_bytes"]
                ys.append(amount / 1e6 / seconds)
            series[name] = ys
        panels.append((f"loss {loss * 100:g} %", series))
    first = settings[0]
    title = args.title or (f"{first['shape']}, {first['raw_bytes'] / 1e6:.0f} MB over {first['link_rate']}/s "
                           f"({first['via']}): median of each setting's runs")
    if args.table:
        print_table(settings, names)
    line_panels(args.out, title, "MB/s on the link" if args.wire else "effective raw MB/s",
                [f"{r:g}" for r in rtts], panels)


def parse_rate(text: str) -> float:
    units = {"KB": 1e3, "MB": 1e6, "GB": 1e9}
    return next((float(text[: -len(u)]) * f for u, f in units.items() if text.upper().endswith(u)), None) or float(text)


def print_table(settings, names):
    med = statistics.median
    print("| RTT, loss | " + " | ".join(f"{n}: s, link MB/s (% of link), best 5 s" for n in names) +
          " | " + " | ".join(f"forte vs {n}" for n in names if n != "forte") + " | CPU-s/GB by role |")
    print("|---|" + "---:|" * len(names) + "---:|" * (len(names) - 1) + "---|")
    for s in settings:
        link = parse_rate(s["link_rate"])
        cells, times, cpu = [], {}, []
        for n in names:
            runs = s["contenders"].get(n)
            if not runs:
                cells.append("-")
                continue
            t = med(r["seconds"] for r in runs)
            wire = med(r["wire_bytes"] for r in runs) / t
            best = med(max(r["windows_5s"], default=0) for r in runs)
            times[n] = t
            cells.append(f"{t:.1f}, {wire / 1e6:.1f} ({wire / link * 100:.0f} %), {best / 1e6 * 1e6:.0f}")
            roles = runs[0]["roles"]
            if roles:
                per_gb = ", ".join(f"{role} {med(r['roles'][role] for r in runs) / (s['raw_bytes'] / 1e9):.1f}"
                                   for role in roles)
                cpu.append(f"{n.split()[0]}: {per_gb}")
        ratios = [f"{times['forte'] / times[n]:.2f}×" if "forte" in times and n in times else "-"
                  for n in names if n != "forte"]
        print(f"| {s['rtt_ms']:g} ms, {s['loss'] * 100:g} % | " + " | ".join(cells) + " | " + " | ".join(ratios) +
              " | " + "; ".join(cpu) + " |")


if __name__ == "__main__":
    main()
