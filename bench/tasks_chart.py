#!/usr/bin/env python3
"""The Gantt chart of docs/tasks.md: four batches (2-5 files of 4 MB) sent through a relay on
loopback at 20 MB/s, pulled by a core with two site tasks (a per-file `header-check`, two at
once, and a per-batch `register`; each a sleep), then `forte report --charts`. Prints the
report; the chart is OUT/charts/timeline.png.

Usage: bench/tasks_chart.py [OUT] (default /tmp/forte-bench/tasks-chart)
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from binary import FORTE as F  # noqa: E402
from site_setup import make_site, start_relay  # noqa: E402

W = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/forte-bench/tasks-chart")
shutil.rmtree(W, ignore_errors=True)
W.mkdir(parents=True)
for b, n in (("run-01", 3), ("run-02", 5), ("run-03", 2), ("run-04", 4)):
    d = W / "inbox" / b
    d.mkdir(parents=True)
    for i in range(n):
        (d / f"rec{i}.bin").write_bytes(os.urandom(4_000_000))
    (d / ".ready").touch()
make_site(F, W, "site-a")
relay, url, fp = start_relay(F, W / "relay", W / "tokens.toml", "127.0.0.1:0")
conn = ["--relay", url, "--relay-fingerprint", fp, "--token-file"]
(W / "forte.toml").write_text('[[task]]\nname = "header-check"\nat = "core"\nper = "file"\ncommand = "sleep 0.4"\nconcurrency = 2\n\n[[task]]\nname = "register"\nat = "core"\nper = "batch"\ncommand = "sleep 0.6"\n')
try:
    subprocess.run([F, "--catalog", W / "edge.sqlite", "send", W / "inbox", "-q", "--bwlimit", "20MB",
                    "--recipient", W / "keys/core.pub", "--sign", W / "keys/edge.key", "--site", "site-a", *conn, W / "edge.token"], check=True)
    subprocess.run([F, "--config", W / "forte.toml", "--catalog", W / "core.sqlite", "pull", "--to", W / "dest", "-q",
                    "--identity", W / "keys/core.key", "--trust", f"site-a={W / 'keys/edge.pub'}", *conn, W / "core.token"], check=True)
finally:
    relay.terminate(); relay.wait()
out = subprocess.run([F, "--catalog", W / "edge.sqlite", "report", "--with", W / "core.sqlite", "--charts", W / "charts", "--title", "site tasks"], check=True, capture_output=True, text=True).stdout
print(out)
