#!/usr/bin/env python3
"""The dashboard's ETA against what happened, and the dashboard's screenshots (issue 19).

ETA accuracy. The FORTE test set's 14 batches A–N (bench/corpus.py, sizes proportional to the
papers' 337 GB times --scale) are sent in one run through a relay on loopback by
`forte send --watch --bwlimit RATE --http …` (the limit paces the compressed bytes on the wire,
so that the link, not this machine's CPU, sets the pace) and pulled by `forte pull --watch
--http …`, each with its own SQLite catalogue. Every 5 s the sender's /api/v1/overview is read
and, for each batch being sent, its `done_bytes`, `bytes` and `eta_s` kept with the answer's
time. Once every batch is delivered (its pull stage ended), each batch's send stage (`started_us`, `ended_us` from
/api/v1/batches?role=edge) gives the actual remaining time of every sample. Over the last 80 %
of each batch's send time (sample time ≥ start + 0.2 × duration), samples whose actual
remaining time is under 5 s are skipped (counted), a sample without an ETA (null: the page
shows "–") counts as a miss, and the relative error
|eta_s − actual remaining| / actual remaining of the others is reported per batch (samples,
median, max, share within 20 %) and over all batches (share within 20 %, median), for each run
and as medians over the runs. The acceptance point: within 20 % over the last 80 % of a batch.

Screenshots (first run only, unless --no-shots), with headless Chromium driven by selenium at
1440×900 (a laptop screen), full page up to 3000 px high:
  batch.png     the page of a batch being sent (/batches/KEY), once half the batches are
                delivered and one of ≥ 5 % of all bytes is 30–70 % sent
  overview.png  the sender's dashboard (/) right after: batches in flight, stages, rate, ETA
  lineage.png   a delivered file's lineage (/files/OBJECT_ID) of `forte dashboard --catalog
                EDGE --with CORE`, started after the transfer, so both ends' events show
  report.png    that dashboard's /report
A live page is shot once its event stream has updated it (<body data-events> ≥ 2).

Needs Debian's chromium and chromedriver and selenium (a virtualenv's python will do), and the
release build (cargo build --release -p forte, or FORTE_BINARY). Run as root like the other
bench scripts; nothing here needs it but the benches' shared work directory.

Usage: bench/dashboard.py [--runs 3] [--rate 5MB] [--scale 0.011] [--shots docs/dashboard | --no-shots]
                          [--every 5] [--keep]
"""

import argparse
import hashlib
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from binary import FORTE  # noqa: E402
from corpus import BATCHES, build_inbox, ensure_corpus  # noqa: E402
from site_setup import make_site, start_relay  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(os.environ.get("FORTE_BENCH_DIR", "/tmp/forte-bench"))
SITE = "dash"
SAMPLE_EVERY = 5.0  # s between overview samples (--every)
WINDOW = 0.2  # samples before start + WINDOW × duration are not judged
MIN_REMAINING = 5.0  # s: samples with less actual remaining time are skipped
WITHIN = 0.2  # the acceptance bound on the relative error
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1440,900"]
WIDTH, MAX_HEIGHT = 1440, 3000


def log(text):
    print(text, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(base: str, path: str):
    with urllib.request.urlopen(base + path, timeout=10) as r:
        return json.loads(r.read())


def wait_for_api(base: str, proc, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[0]} exited ({proc.returncode}) before serving {base}")
        try:
            return get(base, "/api/v1")
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"nothing answers at {base}/api/v1")


def stop(proc):
    """Ends one process this script started: SIGTERM, then SIGKILL after 10 s."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def digest_tree(root: Path) -> dict:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != ".ready":
            h = hashlib.sha256()
            with open(p, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            out[str(p.relative_to(root))] = h.hexdigest()
    return out


def machine() -> str:
    info = Path("/proc/cpuinfo").read_text()
    model = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), "?")
    mem = next(int(l.split()[1]) for l in Path("/proc/meminfo").read_text().splitlines()
               if l.startswith("MemTotal"))
    return f"{os.cpu_count()} cores ({model}), {mem / 1e6:.1f} GB memory, Linux {os.uname().release}"


class Sampler:
    """Reads the sender's overview every SAMPLE_EVERY seconds in a thread; keeps, per batch
    being sent, (at_us, done_bytes, bytes, eta_s)."""

    def __init__(self, base: str):
        self.base, self.samples, self.overviews, self.reads, self.misses = base, {}, [], 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        next_at = time.monotonic()
        while not self.stop.is_set():
            try:
                o = get(self.base, "/api/v1/overview")
                self.reads += 1
                self.overviews.append(o)
                for b in o["in_flight"]:
                    if b["role"] == "edge" and b["state"] == "sending":
                        self.samples.setdefault(b["key"], []).append(
                            (o["at_us"], b["done_bytes"], b["bytes"], b["eta_s"]))
            except OSError:
                self.misses += 1
            next_at += SAMPLE_EVERY
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_):
        self.stop.set()
        self.thread.join()


def judge(batches: list, samples: dict) -> dict:
    """Each batch's ETA errors over the last 80 % of its send time."""
    result = {}
    for b in batches:
        start, end = b["started_us"], b["ended_us"]
        if start is None or end is None:
            continue
        row = {"name": b["name"], "bytes": b["bytes"], "send_s": (end - start) / 1e6, "errors": [],
               "skipped": 0, "no_eta": 0, "early": 0, "worst": None}
        for at, _done, _bytes, eta in samples.get(b["key"], []):
            if at < start + WINDOW * (end - start):
                row["early"] += 1
                continue
            actual = (end - at) / 1e6
            if actual < MIN_REMAINING:
                row["skipped"] += 1
                continue
            if eta is None:
                row["no_eta"] += 1  # judged a miss: the page showed no ETA
                row["errors"].append(float("inf"))
                continue
            error = abs(eta - actual) / actual
            row["errors"].append(error)
            if row["worst"] is None or error > row["worst"][0]:
                row["worst"] = (error, (at - start) / 1e6, eta, actual)
        result[b["name"]] = row
    return result


def fmt_err(e) -> str:
    return "–" if e is None else ("no ETA" if e == float("inf") else f"{100 * e:.1f} %")


def print_run(n: int, judged: dict):
    print(f"\nrun {n}: ETA error over the last 80 % of each batch's send time "
          f"(samples every {SAMPLE_EVERY:g} s; skipped: actual remaining < {MIN_REMAINING:g} s)\n")
    print("| batch | raw MB | send s | samples | skipped | no ETA | median error | max error | within 20 % "
          "| worst: s into batch, ETA s, actual s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in sorted(judged):
        r = judged[name]
        errs = r["errors"]
        within = sum(e <= WITHIN for e in errs)
        worst = r["worst"]
        print(f"| {name} | {r['bytes'] / 1e6:.0f} | {r['send_s']:.1f} | {len(errs)} | {r['skipped']} | {r['no_eta']} "
              f"| {fmt_err(statistics.median(errs) if errs else None)} | {fmt_err(max(errs) if errs else None)} "
              f"| {f'{within}/{len(errs)}' if errs else '–'} "
              f"| {f'{worst[1]:.0f}, {worst[2]:.1f}, {worst[3]:.1f}' if worst else '–'} |")
    errs = [e for r in judged.values() for e in r["errors"]]
    skipped = sum(r["skipped"] for r in judged.values())
    no_eta = sum(r["no_eta"] for r in judged.values())
    share = sum(e <= WITHIN for e in errs) / len(errs) if errs else float("nan")
    median = statistics.median(errs) if errs else float("nan")
    shown = [e for e in errs if e != float("inf")]
    print(f"\nrun {n} overall: {len(errs)} samples judged, {skipped} skipped (actual remaining "
          f"< {MIN_REMAINING:g} s), {no_eta} without an ETA (counted as misses); within 20 %: "
          f"{100 * share:.1f} %; median error {fmt_err(median)}; max {fmt_err(max(errs) if errs else None)}")
    if no_eta and shown:
        print(f"  of the {len(shown)} samples with an ETA: within 20 %: "
              f"{100 * sum(e <= WITHIN for e in shown) / len(shown):.1f} %; median error "
              f"{fmt_err(statistics.median(shown))}")
    return {"share": share, "median": median, "samples": len(errs), "skipped": skipped, "no_eta": no_eta}


def print_trace(batches: list, samples: dict):
    """Every sample of the largest batch: how its ETA followed the actual remaining time."""
    b = max((b for b in batches if b["ended_us"]), key=lambda b: b["bytes"])
    start, end = b["started_us"], b["ended_us"]
    rows = [f"{(at - start) / 1e6:.0f} s: {100 * done / total:.0f} % done, ETA "
            f"{'–' if eta is None else f'{eta:.0f}'} s, actual {(end - at) / 1e6:.0f} s"
            for at, done, total, eta in samples.get(b["key"], [])]
    print(f"\n{b['name']} (send {(end - start) / 1e6:.0f} s), every sample: " + "; ".join(rows))


class Browser:
    """Headless Chromium under selenium, for full-page screenshots."""

    def __init__(self, profile: Path, driver_log: Path):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in CHROMIUM_FLAGS + [f"--user-data-dir={profile}"]:
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(options=options,
                                       service=Service("/usr/bin/chromedriver", log_output=str(driver_log)))

    def shot(self, url: str, path: Path, live: bool):
        """Loads `url`, waits for its live updates (or its load), and saves the whole page."""
        from selenium.webdriver.support.ui import WebDriverWait
        d = self.driver
        d.set_window_size(WIDTH, 900)
        d.get_log("browser")  # what earlier pages logged is theirs
        d.get(url)
        events = lambda: int(d.execute_script("return document.body.dataset.events || '0'"))
        if live:
            WebDriverWait(d, 30).until(lambda _: events() >= 2)
        WebDriverWait(d, 30).until(lambda _: d.execute_script(
            "return document.readyState === 'complete' && "
            "Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)"))
        height = min(d.execute_script("return document.documentElement.scrollHeight"), MAX_HEIGHT)
        # The window's size includes what is not page (even headless): add that much.
        chrome = d.execute_script("return window.outerHeight - window.innerHeight")
        d.set_window_size(WIDTH, max(height, 900) + chrome)
        if live:  # one more update at the new size
            seen = events()
            WebDriverWait(d, 30).until(lambda _: events() > seen)
        else:
            time.sleep(0.5)
        path.parent.mkdir(parents=True, exist_ok=True)
        d.save_screenshot(str(path))
        seen = events() if live else "no"
        state = d.execute_script("const s = document.querySelector('#summary dd.state'); "
                                 "return s ? ' (batch ' + s.textContent + ')' : ''")
        problems = [e for e in d.get_log("browser") if e.get("level") in ("SEVERE", "WARNING")]
        d.get("about:blank")  # closes the page's event stream before its server may stop
        log(f"  screenshot {path}{state} ({url}, {height} px page, "
            f"{seen} live events) {'console: ' + repr(problems) if problems else 'no console errors'}")

    def quit(self):
        self.driver.quit()


def one_run(n: int, args, work: Path, source: Path, source_digest: dict, raw: int, shots: Path | None):
    run = work / f"run-{n}"
    inbox, dest, staging = run / "inbox", run / "dest", run / "staging"
    for d in (inbox, dest, staging):
        d.mkdir(parents=True)
    p_send, p_pull, p_dash = free_port(), free_port(), free_port()
    send_api, pull_api = f"http://127.0.0.1:{p_send}", f"http://127.0.0.1:{p_pull}"
    procs, browser = {}, None  # name → process, each ended in the finally below
    logs = {name: open(run / f"{name}.log", "w") for name in ("relay", "send", "pull", "dashboard")}
    try:
        relay, url, fingerprint = start_relay(FORTE, run / "relay", work / "tokens.toml", "127.0.0.1:0",
                                              stderr=logs["relay"])
        procs["relay"] = relay
        conn = ["--relay", url, "--relay-fingerprint", fingerprint, "--token-file"]
        send_cmd = [FORTE, "--catalog", run / "edge.sqlite", "send", inbox, "--watch", "--interval", "1",
                    "--http", f"127.0.0.1:{p_send}", "--bwlimit", args.rate,
                    "--recipient", work / "keys/core.pub", "--sign", work / "keys/edge.key",
                    "--site", SITE, *conn, work / "edge.token"]
        pull_cmd = [FORTE, "--catalog", run / "core.sqlite", "pull", "--watch", "--interval", "1",
                    "--http", f"127.0.0.1:{p_pull}", "--to", dest, "--identity", work / "keys/core.key",
                    "--trust", f"{SITE}={work / 'keys/edge.pub'}", *conn, work / "core.token"]
        if n == 1:
            print("\ncommands (run 1):")
            for cmd in (send_cmd, pull_cmd):
                print("  " + shlex.join(map(str, cmd)))
        for cmd, name in ((pull_cmd, "pull"), (send_cmd, "send")):
            procs[name] = subprocess.Popen([str(c) for c in cmd], stdout=logs[name], stderr=subprocess.STDOUT)
        wait_for_api(send_api, procs["send"])
        wait_for_api(pull_api, procs["pull"])
        # All 14 batches arrive at once: hard-linked copies staged outside the inbox, moved in,
        # then marked ready.
        for name, _ in BATCHES:
            subprocess.run(["cp", "-al", source / f"batch-{name}", staging / f"batch-{name}"], check=True)
            (staging / f"batch-{name}" / ".ready").unlink()
        for name, _ in BATCHES:
            os.rename(staging / f"batch-{name}", inbox / f"batch-{name}")
        for name, _ in BATCHES:
            (inbox / f"batch-{name}" / ".ready").touch()
        started = time.monotonic()
        shot_batch = None
        with Sampler(send_api) as sampler:
            if shots:
                browser = Browser(run / "chromium-profile", run / "chromedriver.log")
            deadline = started + args.timeout
            while True:
                # Delivered, and its pull stage ended: the state is recorded before the relay is
                # told (acknowledged), the stage's end after; stopping the puller in between
                # would leave the batch out of the report's KPIs.
                core = get(pull_api, "/api/v1/batches?role=core&state=delivered")["batches"]
                delivered = len(core)
                if delivered >= len(BATCHES) and all(b["ended_us"] for b in core):
                    break
                for name, proc in procs.items():
                    if proc.poll() is not None:
                        raise SystemExit(f"run {n}: {name} exited ({proc.returncode}); see {run}/{name}.log")
                if time.monotonic() > deadline:
                    raise SystemExit(f"run {n}: only {delivered} of {len(BATCHES)} batches delivered "
                                     f"in {args.timeout} s; see {run}")
                # Mid-transfer: half the batches delivered, larger ones being sent.
                if browser and shot_batch is None and delivered >= len(BATCHES) // 2:
                    shot_batch = mid_transfer_shots(browser, send_api, shots, raw)
                time.sleep(1)
        took = time.monotonic() - started
        if browser and shot_batch is None:
            log(f"  run {n}: no moment with half the batches delivered and a large one 30–70 % sent: "
                "no overview.png or batch.png")
        edge = get(send_api, "/api/v1/batches?role=edge&limit=200")["batches"]
        log(f"run {n}: all {len(BATCHES)} batches delivered in {took:.0f} s "
            f"({sampler.reads} overview samples, {sampler.misses} missed)")
        stop(procs["send"])
        stop(procs["pull"])
        if digest_tree(dest / SITE) != source_digest:
            raise SystemExit(f"run {n}: the delivered files differ from the source; see {run}")
        if shots:
            dash = subprocess.Popen([str(FORTE), "dashboard", "--catalog", str(run / "edge.sqlite"), "--with",
                                     str(run / "core.sqlite"), "--http", f"127.0.0.1:{p_dash}"],
                                    stdout=logs["dashboard"], stderr=subprocess.STDOUT)
            procs["dashboard"] = dash
            dash_api = f"http://127.0.0.1:{p_dash}"
            wait_for_api(dash_api, dash)
            after_transfer_shots(browser, dash_api, shots)
        with open(run / "samples.json", "w") as f:
            json.dump({"samples": sampler.samples, "edge": edge, "overviews": sampler.overviews}, f)
        judged = judge(edge, sampler.samples)
        summary = print_run(n, judged)
        print_trace(edge, sampler.samples)
        summary["seconds"] = took
        summary["judged"] = judged
        return summary
    finally:
        if browser:
            browser.quit()
        for proc in reversed(procs.values()):
            stop(proc)
        for f in logs.values():
            f.close()


def mid_transfer_shots(browser: Browser, send_api: str, shots: Path, raw: int):
    """One batch's page and the sender's overview, once a batch of ≥ 5 % of all bytes (G or
    larger) is between 30 % and 70 % sent with an ETA; returns its key, or None if the moment
    has not come yet."""
    o = get(send_api, "/api/v1/overview")
    sending = [b for b in o["in_flight"] if b["state"] == "sending" and b["eta_s"] is not None
               and b["bytes"] >= 0.05 * raw and 0.3 <= b["progress"] <= 0.7]
    if not sending:
        return None
    key = sending[0]["key"]
    log(f"  mid-transfer shots: {len(o['in_flight'])} in flight, {sending[0]['name']} "
        f"{100 * sending[0]['progress']:.0f} % sent, ETA {sending[0]['eta_s']:.0f} s")
    # The batch first, while it is still being sent.
    browser.shot(f"{send_api}/batches/{key}", shots / "batch.png", live=True)
    browser.shot(send_api + "/", shots / "overview.png", live=True)
    return key


def after_transfer_shots(browser: Browser, dash_api: str, shots: Path):
    """A delivered file's lineage and the report, from `forte dashboard` over both catalogues."""
    edge_g = get(dash_api, "/api/v1/batches?role=edge&name=batch-G")["batches"][0]
    files = get(dash_api, f"/api/v1/batches/{edge_g['key']}")["files"]
    bag = next(f for f in sorted(files, key=lambda f: f["path"]) if f["path"].startswith("bags/"))
    browser.shot(f"{dash_api}/files/{bag['object_id']}", shots / "lineage.png", live=False)
    browser.shot(f"{dash_api}/report", shots / "report.png", live=False)


def main():
    global SAMPLE_EVERY
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rate", default="5MB", help="send --bwlimit (compressed bytes on the wire per second)")
    ap.add_argument("--scale", type=float, default=0.011, help="of the papers' 337 GB (0.011: 3.7 GB raw)")
    ap.add_argument("--shots", type=Path, default=ROOT / "docs" / "dashboard",
                    help="where the screenshots go (taken in the first run)")
    ap.add_argument("--no-shots", action="store_true")
    ap.add_argument("--timeout", type=float, default=1800, help="s a run may take")
    ap.add_argument("--every", type=float, default=SAMPLE_EVERY,
                    help="s between overview samples (the acceptance's 5; 1 judges every second of a batch's tail)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the work directory (batches, catalogues, logs, and each run's samples.json "
                         "with every overview read)")
    args = ap.parse_args()
    SAMPLE_EVERY = args.every
    if not FORTE.exists():
        sys.exit(f"{FORTE} is missing: cargo build --release -p forte")
    print(f"machine: {machine()}")
    print(f"command: {shlex.join(sys.argv)}")
    print(f"forte: {FORTE} ({subprocess.run([FORTE, '--version'], capture_output=True, text=True).stdout.strip()})")
    BENCH.mkdir(parents=True, exist_ok=True)
    ensure_corpus()
    work = Path(tempfile.mkdtemp(prefix="dashboard-", dir=BENCH))
    try:
        make_site(FORTE, work, SITE)
        source = work / "source"
        raw = build_inbox(source, args.scale)
        source_digest = digest_tree(source)
        print(f"batches A–N: {raw / 1e6:.0f} MB raw, {len(source_digest)} files; --bwlimit {args.rate}")
        results = []
        for n in range(1, args.runs + 1):
            shots = None if args.no_shots or n > 1 else args.shots
            results.append(one_run(n, args, work, source, source_digest, raw, shots))
            if not args.keep:
                shutil.rmtree(work / f"run-{n}", ignore_errors=True)
        summarise(results)
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def summarise(results: list):
    runs = len(results)
    print(f"\nmedians over {runs} run(s)\n")
    print("| batch | send s | samples | median error | max error | within 20 % |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in sorted(results[0]["judged"]):
        rows = [r["judged"][name] for r in results if name in r["judged"]]
        med = lambda xs: statistics.median(xs) if xs else None
        medians = [statistics.median(r["errors"]) for r in rows if r["errors"]]
        maxes = [max(r["errors"]) for r in rows if r["errors"]]
        shares = [sum(e <= WITHIN for e in r["errors"]) / len(r["errors"]) for r in rows if r["errors"]]
        print(f"| {name} | {med([r['send_s'] for r in rows]):.1f} | {med([len(r['errors']) for r in rows]):g} "
              f"| {fmt_err(med(medians))} | {fmt_err(med(maxes))} "
              f"| {'–' if not shares else f'{100 * med(shares):.0f} %'} |")
    each = lambda key, form: ", ".join(form(r[key]) for r in results)
    percent = fmt_err
    print(f"\noverall, median of {runs} run(s): within 20 %: "
          f"{percent(statistics.median(r['share'] for r in results))} of samples "
          f"(runs: {each('share', percent)}); median error "
          f"{percent(statistics.median(r['median'] for r in results))} (runs: {each('median', percent)}); "
          f"samples judged {each('samples', str)}, skipped {each('skipped', str)}, without an ETA "
          f"{each('no_eta', str)}; "
          f"transfer {statistics.median(r['seconds'] for r in results):.0f} s "
          f"(runs: {each('seconds', lambda s: f'{s:.0f} s')})")


if __name__ == "__main__":
    main()
