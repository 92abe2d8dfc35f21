#!/usr/bin/env python3
"""A year of history: forte's catalogues grown to a year's size from forte's own rows, and
every periodic path, view and daemon measured against the 20-batch catalogues they grew from,
in the same invocation.

1. Seed: a real relay, `send` and `pull` (the given binary) move 20 batches of small files;
   the edge's and the core's SQLite catalogues are the 20-batch baseline.
2. Grow: copies of those catalogues get the seed's rows again and again, each copy with new
   batch, object, event and instance ids, new batch names, its times moved back so that the
   copies span a year, and sequence numbers in order. The core's rows are spread over five
   sites and keep a share of each batch's files (a year: edge 5 000 batches, ~1 M files;
   core 25 000 batches, ~2.3 M files). Usage samples: one a second per node for
   `--usage-days` days.
3. Measure, on the baseline and the year, back to back: a one-shot `pull` with nothing
   waiting, `status`, `report`, an idle `pull --watch --http` and `send --watch --http` (CPU
   over `--seconds`), every dashboard route (median latency) and the dashboard's memory.

Usage: bench/year.py --binary target/release/forte [--scale 1.0] [--seconds 30]
`--scale 0.1` builds a tenth of a year (for a quick look); the table goes to standard output.
"""

import argparse
import json
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from site_setup import make_site, start_relay  # noqa: E402

SEED_BATCHES = 20
FILES_PER_BATCH = 200
SITE = "year"
CORE_SITES = [f"site-{i}" for i in range(1, 6)]
YEAR_US = 365 * 86400 * 1_000_000
# Columns holding times (microseconds), per table: moved back in each copy.
TIMES = {
    "batches": ["created_at", "updated_at"],
    "files": ["updated_at"],
    "parts": ["updated_at"],
    "events": ["at"],
    "attempts": ["started_at", "ended_at"],
    "stages": ["started_at", "ended_at"],
    "task_runs": ["queued_at", "started_at", "ended_at"],
    "batch_instances": ["sealed_at", "recorded_at"],
}
# Columns holding ids (hex): given a copy's own prefix.
IDS = {
    "files": ["object_id", "carrier"],
    "parts": ["object_id"],
    "events": ["id", "object_id"],
    "attempts": ["id", "object_id"],
    "task_runs": ["id", "object_id"],
    "batch_instances": ["instance"],
}
# Every page and route of the dashboard that answers once (`/api/v1/events` is a stream).
ROUTES = ["/", "/history", "/report", "/api/v1/overview", "/api/v1/batches", "/api/v1/failures",
          "/api/v1/stages", "/api/v1/kpis", "/api/v1/usage", "/api/v1/files",
          "/api/v1/charts/timeline.svg", "/api/v1/charts/utilisation.svg"]


def log(text):
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def seed(forte: Path, work: Path) -> dict:
    """Moves 20 batches through a real relay; returns how to reach it and the catalogues."""
    make_site(forte, work, SITE)
    relay, url, fingerprint = start_relay(forte, work / "store", work / "tokens.toml", f"127.0.0.1:{free_port()}")
    inbox = work / "inbox"
    for b in range(SEED_BATCHES):
        batch = inbox / f"run-{b:03d}"
        batch.mkdir(parents=True)
        for f in range(FILES_PER_BATCH):
            (batch / f"f{f:04d}.dat").write_bytes(os.urandom(1024 + (f * 37) % 3072))
        (batch / ".ready").write_text("")
    keys = work / "keys"
    conn = ["--relay", url, "--relay-fingerprint", fingerprint]
    site = {
        "relay": relay, "work": work, "inbox": inbox,
        "send": ["send", inbox, "--site", SITE, "--recipient", keys / "core.pub", "--sign", keys / "edge.key",
                 "--receipt-pub", keys / "receipt.pub", *conn, "--token-file", work / "edge.token"],
        "pull": ["pull", "--to", work / "dest", "--identity", keys / "core.key",
                 *[a for s in [SITE, *CORE_SITES] for a in ("--trust", f"{s}={keys / 'edge.pub'}")],
                 "--receipt-key", keys / "receipt.key", *conn, "--token-file", work / "core.token"],
        "edge": work / "edge.sqlite", "core": work / "core.sqlite",
    }
    run(forte, site["edge"], [*site["send"], "-q"])
    run(forte, site["core"], site["pull"])
    # The sources were kept (no --delete-after-ack): an idle sender must find nothing new.
    shutil.rmtree(inbox)
    inbox.mkdir()
    return site


def run(forte, catalog, args, timeout=600):
    out = subprocess.run([forte, "--catalog", catalog, *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"forte {' '.join(map(str, args[:2]))} failed: {out.stderr[-2000:]}")
    return out


def grown(seed_db: Path, to: Path, copies: int, sites: list, keep: float, usage_days: float, node: str):
    """A copy of `seed_db` with its rows `copies` times more (see the module's text)."""
    # Through SQLite's backup: a copy of the file alone would miss what its WAL holds.
    with sqlite3.connect(seed_db) as src, sqlite3.connect(to) as dst:
        src.backup(dst)
    db = sqlite3.connect(to)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = OFF")
    spacing = YEAR_US // max(copies, 1)
    seed_seq = db.execute("SELECT COALESCE(MAX(sequence), 0) FROM batch_instances").fetchone()[0]
    # The seed's own rows are the newest: their sequence numbers go after every copy's.
    db.execute("UPDATE batch_instances SET sequence = sequence + ?", (copies * seed_seq,))
    db.execute("UPDATE sequence_epochs SET first_sequence = 1")
    tables = {}
    for table in ["batches", *IDS.keys(), "stages"]:
        cur = db.execute(f"SELECT * FROM {table}")
        tables[table] = ([d[0] for d in cur.description], cur.fetchall())
    for k in range(copies):
        site = sites[k % len(sites)]
        prefix = f"{k:08x}"
        shift = (k + 1) * spacing

        def new_key(key):
            # Edge: the batch id; core: site/id.
            if "/" in key:
                return f"{site}/{prefix}{key.split('/', 1)[1][8:]}"
            return prefix + key[8:]

        def new_id(value):
            return prefix + value[8:] if value else value

        for table, (cols, rows) in tables.items():
            out = []
            ci = {c: i for i, c in enumerate(cols)}
            for row in rows:
                row = list(row)
                if "object_id" in ci and keep < 1 and row[ci["object_id"]]:
                    # The core keeps a share of each batch's files (and their parts and events).
                    if int(row[ci["object_id"]][-4:], 16) / 65536 >= keep:
                        continue
                if "batch_key" in ci:
                    old = row[ci["batch_key"]]
                    row[ci["batch_key"]] = new_key(old)
                for c in IDS.get(table, []):
                    row[ci[c]] = new_id(row[ci[c]])
                for c in TIMES.get(table, []):
                    if row[ci[c]] is not None:
                        row[ci[c]] -= shift
                if table == "batches":
                    row[ci["name"]] = f"{row[ci['name']]}.{k:05d}"
                    if row[ci["site"]]:
                        row[ci["site"]] = site
                if table == "files" and row[ci["delivered_to"]]:
                    _, name, rest = row[ci["delivered_to"]].split("/", 2)
                    row[ci["delivered_to"]] = f"{site}/{name}.{k:05d}/{rest}"
                if table == "batch_instances":
                    row[ci["site"]] = site if row[ci["site"]] else row[ci["site"]]
                    row[ci["sequence"]] += (copies - 1 - k) * seed_seq - copies * seed_seq
                    row[ci["objects"]] = " ".join(new_id(o) for o in row[ci["objects"]].split())
                out.append(row)
            marks = ",".join("?" * len(cols))
            db.executemany(f"INSERT INTO {table} ({','.join(cols)}) VALUES ({marks})", out)
        if k % 50 == 49:
            db.commit()
            log(f"  {to.name}: {k + 1} of {copies} copies")
    if usage_days > 0:
        cols = [r[1] for r in db.execute("PRAGMA table_info(usage)")]
        last = db.execute("SELECT * FROM usage ORDER BY at DESC LIMIT 1").fetchone()
        if last is not None:
            at_i = cols.index("at")
            node_i = cols.index("node")
            seconds = int(usage_days * 86400)
            step = 100_000
            for start in range(0, seconds, step):
                rows = []
                for s in range(start, min(start + step, seconds)):
                    row = list(last)
                    row[node_i] = node if node else row[node_i]
                    row[at_i] = last[at_i] - (s + 1) * 1_000_000
                    rows.append(row)
                marks = ",".join("?" * len(cols))
                db.executemany(f"INSERT OR IGNORE INTO usage ({','.join(cols)}) VALUES ({marks})", rows)
            db.commit()
    db.commit()
    db.close()


def counts(db: Path) -> dict:
    with sqlite3.connect(db) as c:
        return {t: c.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in ("batches", "files", "events", "usage", "batch_instances")}


def timed(forte, catalog, args, runs=3, timeout=300) -> float:
    times = []
    for _ in range(runs):
        start = time.monotonic()
        out = subprocess.run([forte, "--catalog", catalog, *args], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, timeout=timeout)
        if out.returncode != 0:
            raise SystemExit(f"forte {args[0]} on {catalog} failed: {out.stderr[-2000:]}")
        times.append(time.monotonic() - start)
    return statistics.median(times)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_http(base, proc, seconds=120):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{base}: the daemon ended with {proc.returncode}")
        try:
            urllib.request.urlopen(base + "/api/v1/overview", timeout=60).read()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{base} never answered")


def idle_cpu(forte, catalog, args, seconds, warmup=5) -> float:
    """Percent of a core an idle watching daemon uses over `seconds`, after it answers."""
    port = free_port()
    proc = subprocess.Popen([forte, "--catalog", catalog, *args, "--watch", "--interval", "1",
                             "--http", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}", proc)
        time.sleep(warmup)
        before, start = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(seconds)
        return 100 * (cpu_seconds(proc.pid) - before) / (time.monotonic() - start)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def dashboard(forte, edge, core, runs=3) -> dict:
    port = free_port()
    proc = subprocess.Popen([forte, "--catalog", edge, "dashboard", "--with", core, "--http", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base, proc)
        out = {}
        for route in ROUTES:
            times = []
            for _ in range(runs):
                start = time.monotonic()
                try:
                    urllib.request.urlopen(base + route, timeout=300).read()
                except OSError as e:
                    times.append(float("nan"))
                    log(f"  {route}: {e}")
                    continue
                times.append(time.monotonic() - start)
            out[route] = statistics.median(times)
        rss = int(Path(f"/proc/{proc.pid}/status").read_text().split("VmHWM:")[1].split()[0]) // 1024
        out["rss_mb"] = rss
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", required=True, type=Path)
    p.add_argument("--scale", type=float, default=1.0, help="share of a year to build (1.0: a year)")
    p.add_argument("--usage-days", type=float, default=30)
    p.add_argument("--seconds", type=float, default=30, help="how long each idle daemon is measured")
    p.add_argument("--work", type=Path, help="keep the catalogues here (default: a temporary directory)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    forte = args.binary.resolve()
    work = args.work or Path(tempfile.mkdtemp(prefix="forte-year-"))
    work.mkdir(parents=True, exist_ok=True)
    log(f"seed: {SEED_BATCHES} batches of {FILES_PER_BATCH} files through a real relay, in {work}")
    site = seed(forte, work)
    edge_copies = max(1, round(5000 * args.scale / SEED_BATCHES))
    core_copies = max(1, round(25000 * args.scale / SEED_BATCHES))
    year = {"edge": work / "edge-year.sqlite", "core": work / "core-year.sqlite"}
    log(f"grow: edge ×{edge_copies}, core ×{core_copies} (five sites)")
    started = time.monotonic()
    grown(site["edge"], year["edge"], edge_copies, [SITE], 1.0, args.usage_days, "")
    grown(site["core"], year["core"], core_copies, CORE_SITES, 0.46, args.usage_days, "")
    log(f"grown in {time.monotonic() - started:.0f} s")
    sizes = {role: {"baseline": counts(site[role]), "year": counts(year[role])} for role in ("edge", "core")}
    for role, c in sizes.items():
        log(f"  {role}: {c['year']} ({year[role].stat().st_size >> 20} MiB)")
    results = {"sizes": sizes, "machine": f"{os.cpu_count()} cores", "scale": args.scale}
    for label, edge, core in (("baseline", site["edge"], site["core"]), ("year", year["edge"], year["core"])):
        log(f"measure: {label}")
        r = {}
        r["pull_nothing_waiting_s"] = timed(forte, core, site["pull"])
        r["status_s"] = timed(forte, core, ["status"])
        r["report_s"] = timed(forte, core, ["report"])
        # The first daemon on a catalogue rolls up the usage samples older than a day (once,
        # at its first minute): left out of the idle figure by a warm-up past a minute.
        r["pull_idle_cpu_pct"] = idle_cpu(forte, core, site["pull"], args.seconds, warmup=70)
        r["send_idle_cpu_pct"] = idle_cpu(forte, edge, site["send"], args.seconds, warmup=70)
        r["dashboard"] = dashboard(forte, edge, core)
        r["usage_rows_after"] = {role: counts(db)["usage"] for role, db in (("edge", edge), ("core", core))}
        results[label] = r
        log(f"  {json.dumps(r)}")
    site["relay"].terminate()
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


def print_table(r):
    b, y = r["baseline"], r["year"]
    print(f"| what | {SEED_BATCHES} batches | a year ({r['scale']:g}) | ratio |")
    print("|---|---|---|---|")

    def row(what, a, c, unit):
        ratio = c / a if a else float("inf")
        print(f"| {what} | {a:.3g} {unit} | {c:.3g} {unit} | {ratio:.1f} |")
    row("one-shot `pull`, nothing waiting", b["pull_nothing_waiting_s"], y["pull_nothing_waiting_s"], "s")
    row("`forte status`", b["status_s"], y["status_s"], "s")
    row("`forte report`", b["report_s"], y["report_s"], "s")
    row("idle `pull --watch --http`, CPU", b["pull_idle_cpu_pct"], y["pull_idle_cpu_pct"], "% of a core")
    row("idle `send --watch --http`, CPU", b["send_idle_cpu_pct"], y["send_idle_cpu_pct"], "% of a core")
    for route in ROUTES:
        row(f"dashboard `{route}`", b["dashboard"][route], y["dashboard"][route], "s")
    row("dashboard peak RSS", b["dashboard"]["rss_mb"], y["dashboard"]["rss_mb"], "MB")
    for role in ("edge", "core"):
        row(f"{role} usage rows: grown / after the daemons ran", r["sizes"][role]["year"]["usage"],
            y["usage_rows_after"][role], "rows")


if __name__ == "__main__":
    main()
