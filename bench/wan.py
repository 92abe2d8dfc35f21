#!/usr/bin/env python3
"""End to end over an emulated WAN: forte against what people use today, same data, same link.

The site (edge) runs in a network namespace behind a veth pair whose egress is shaped by tbf
to --link-rate (default the papers' 65 MB/s); Toxiproxy, on the data-centre side, adds
--latency-ms (default 20) to every byte the site sends, so each contender crosses the same
link with the same added round-trip time. The data is the FORTE test set's 14 batches A–N
(bench/network.py's builder, --scale of the papers' 337 GB).

Contenders, each timed from start to the moment the last file is in its final place:
  forte            send (edge) → relay → pull --watch (core): encrypted, signed, verified,
                   catalogued, delivered under {site}/{batch}/{path}
  rsync + copy     the papers' baseline: rsync of the raw files to the DMZ (rsync daemon), then
                   a second copy step into storage
  CB-IM + rsync    the papers' pipe chain at the edge (sha256sum | zstd -3 | gpg -e | sha256sum,
                   two files at a time), rsync of the results, then gpg -d | zstd -d at the core
  rsync -z zstd N  `rsync -z --compress-choice=zstd --compress-level=N` straight to storage
                   (what a careful admin would do; no encryption, no end-to-end check); N is
                   rsync's default 3, and --rsync-levels adds others (the first is the one the
                   issue's target is measured against); N/T also passes --compress-threads=T
                   (rsync's default is one compressing thread)
  rclone copy      `rclone copy --transfers 4` to `rclone serve webdav` at the data centre

Every contender's result is compared with the source (sizes and SHA-256 of every file). Runs
are interleaved (each round runs every contender once); medians are reported, with the bytes
each contender put on the link (counted on the data-centre end of the veth pair: payload plus
TCP/IP and TLS framing) and the rate they crossed it at: a contender near the link's rate is
link-bound, and only a better compression ratio makes it faster.

Needs root, rsync, rclone, gpg, zstd and Toxiproxy's server (found on PATH or in ~/go/bin);
`bench/setup.sh` installs them all. Run as root: it creates network namespaces.

Usage (as root): bench/wan.py [--link-rate 65MB] [--latency-ms 20] [--scale 0.003 | --small 3000] [--runs 3]
                 [--level 3,auto] [--rsync-levels 3,1,3/2] [--pin] [--window 30] [--chart FILE]
                 [--compare NAME=PATH]
"""

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import shlex
import shutil
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from chart import bar_chart
from corpus import build_incompressible_batch, build_inbox, build_small_inbox
from network import NS, parse_rate, set_link_rate, setup_link, teardown_link
from site_setup import add_edge_site, make_site, start_relay
from binary import FORTE

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("FORTE_BENCH_DIR", "/tmp/forte-bench")) / "wan"
DC = "10.77.0.2"  # the data-centre end of the veth pair
API = "http://127.0.0.1:8474"
# The data centre's storage (every contender's destination, the relay's directory and the rsync
# daemon's modules): a journaled ext4 made afresh before each run, see Storage.
VOLUME = WORK / "vol"
RSYNC_STORE = VOLUME / "rsync-store"  # the rsync daemon's module that rsync -z writes into


def sh(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


SITE_CPUS: list = []  # --pin: the site's commands run on these CPUs only (taskset)


def at_site(cmd):
    """A command run in the site's namespace, behind the shaped link (and on the site's CPU with --pin)."""
    pin = ["taskset", "-c", ",".join(map(str, SITE_CPUS))] if SITE_CPUS else []
    return ["ip", "netns", "exec", NS, *pin, *map(str, cmd)]


def toxiproxy_server():
    for candidate in [shutil.which("toxiproxy-server"), Path.home() / "go/bin/server"]:
        if candidate and Path(candidate).exists():
            return str(candidate)
    sys.exit("Toxiproxy's server is missing: go install github.com/Shopify/toxiproxy/v2/cmd/server@v2.12.0")


def api(method, path, body=None):
    req = urllib.request.Request(API + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return r.read()


def delayed(name, listen_port, upstream, latency_ms):
    """A Toxiproxy proxy on the data-centre address adding latency to what the site sends."""
    api("POST", "/proxies", {"name": name, "listen": f"{DC}:{listen_port}", "upstream": upstream})
    api("POST", f"/proxies/{name}/toxics",
        {"type": "latency", "stream": "upstream", "attributes": {"latency": latency_ms}})
    return f"{DC}:{listen_port}"


def digest_tree(root: Path):
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != ".ready":
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def link_bytes() -> int:
    """Bytes the site has sent over the shaped link so far (frames received at the data centre)."""
    return int(Path("/sys/class/net/veth-dc/statistics/rx_bytes").read_text())


def cpu_busy() -> list:
    """Seconds each CPU has spent busy (not idle or waiting on I/O) since boot, from /proc/stat."""
    tick = os.sysconf("SC_CLK_TCK")
    busy = []
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            user, nice, system, _idle, _iowait, irq, softirq = map(int, fields[:7])
            busy.append((user + nice + system + irq + softirq) / tick)
    return busy


class Sampler:
    """Calls `read` every `period` seconds in a thread while a run goes, keeping (time, value)."""

    def __init__(self, read, period: float):
        self.read, self.period, self.samples, self.stop = read, period, [], threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self.stop.is_set():
            try:
                self.samples.append((time.monotonic(), self.read()))
            except OSError:
                pass  # one reading missed (the relay busy answering): the next will do
            self.stop.wait(self.period)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_):
        self.stop.set()
        self.thread.join()


class LinkSampler(Sampler):
    """The link's byte counter every `period` seconds, so a rate can be judged window by
    window (a limit held, a step followed), not only on average."""

    def __init__(self, period: float = 0.5):
        super().__init__(link_bytes, period)

    def window_rates(self, seconds: float) -> list:
        """MB/s on the link over each whole window of `seconds` from the first sample on."""
        rates, start = [], 0
        for i, (t, b) in enumerate(self.samples):
            t0, b0 = self.samples[start]
            if t - t0 >= seconds:
                rates.append((b - b0) / 1e6 / (t - t0))
                start = i
        return rates


class SiteShares(Sampler):
    """Each site's bytes as they arrive at the relay (its `forte_relay_received_bytes_total`,
    read every second with the core token): what each sender got of the link."""

    def __init__(self, url: str, token: str, sites=("wan", "wan2")):
        self.url, self.token, self.sites = url, token, sites
        super().__init__(self._read, 1.0)

    def _read(self):
        import ssl
        request = urllib.request.Request(f"{self.url}/metrics", headers={"Authorization": f"Bearer {self.token}"})
        # The bench's own relay on loopback, whose certificate is self-signed.
        text = urllib.request.urlopen(request, context=ssl._create_unverified_context(), timeout=5).read().decode()
        got = {}
        for line in text.splitlines():
            if line.startswith("forte_relay_received_bytes_total{"):
                labels, value = line.rsplit(" ", 1)
                for site in self.sites:
                    if f'site="{site}"' in labels:
                        got[site] = float(value)
        return [got.get(site, 0.0) for site in self.sites]

    def report(self, window: float = 10.0, within: float = 0.05):
        """Prints site 1's share per `window` seconds while both send, and from which second
        on every window stays within `within` of an equal share."""
        both = [(t, b) for t, b in self.samples if all(x > 0 for x in b)]
        windows, start = [], 0
        for i, (t, b) in enumerate(both):
            t0, b0 = both[start]
            if t - t0 >= window:
                got = [x - y for x, y in zip(b, b0)]
                # A window in which one site had finished (sent under a tenth of the other) is
                # not a share of the link.
                if min(got) > 0.1 * max(got):
                    windows.append((t0 - both[0][0], got[0] / sum(got), sum(got) / (t - t0) / 1e6))
                start = i
        if not windows:
            print("  shares: the two sites never sent at once for a whole window", file=sys.stderr)
            return
        print(f"  site 1's share of the link per {window:g}-s window at the relay (s from the first "
              "byte of both, share, MB/s of both): " +
              ", ".join(f"{t:.0f}: {share:.2f} {rate:.1f}" for t, share, rate in windows), file=sys.stderr)
        fair_from = None
        for t, share, _ in windows:
            if abs(share - 0.5) > within:
                fair_from = None
            elif fair_from is None:
                fair_from = t
        print("  " + (f"within {within:.2f} of equal from {fair_from:.0f} s on" if fair_from is not None
                      else f"not within {within:.2f} of equal at the end"), file=sys.stderr)


class RateSteps:
    """Changes the link's rate at set seconds into a run (`--step 30:20MB,60:65MB`) in a thread,
    and sets it back to `base` when the run ends: a link whose spare bandwidth changes."""

    def __init__(self, base: float, steps: str = None):
        self.base, self.stop = base, threading.Event()
        self.steps = [(float(t), parse_rate(r)) for t, r in
                      (s.split(":", 1) for s in steps.split(","))] if steps else []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        start = time.monotonic()
        for at, rate in self.steps:
            if self.stop.wait(max(0.0, start + at - time.monotonic())):
                return
            set_link_rate(rate)
            print(f"  link rate {rate / 1e6:.0f} MB/s at {time.monotonic() - start:.1f} s", file=sys.stderr)

    def __enter__(self):
        if self.steps:
            self.thread.start()
        return self

    def __exit__(self, *_):
        self.stop.set()
        if self.steps:
            self.thread.join()
            set_link_rate(self.base)


class Storage:
    """The data centre's storage, a journaled ext4 on a loop device, made afresh before each run.

    The host's root file system here is ext4 without a journal, where allocating an inode skips
    every inode deleted in the last `dirty_expire` seconds (30) after reading its inode table
    block: a run that writes 10 000 files right after the last run deleted 10 000 spent two
    thirds of its CPU in that scan (perf, stop 32), and each round was slower than the one
    before, for every contender. A storage system with a journal, as any data centre's has,
    does not do this, and a fresh one gives every contender in every round the same start."""

    def __init__(self, size="8G", mount=VOLUME):
        self.image = mount.with_suffix(".img")
        self.size = size
        self.mount = mount

    def remake(self):
        self.unmount()
        self.image.unlink(missing_ok=True)
        sh(["truncate", "-s", self.size, self.image])
        # Inode tables and journal are zeroed now, not by a kernel thread during the run.
        sh(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.image])
        self.mount.mkdir(parents=True, exist_ok=True)
        sh(["mount", "-o", "loop", self.image, self.mount])

    def unmount(self):
        if os.path.ismount(self.mount):
            sh(["umount", self.mount])


def delivered(dest: Path, site: str, want: int) -> bool:
    """Whether `want` files are in place under dest/site. The tree is walked only when no batch
    is being put in place (no staging directory in `dest`): a walk of 10 000 files takes about
    10 ms, so walking it every 10 ms would take a core from forte while it runs, which rsync,
    timed by its exit, does not pay."""
    try:
        if any(name.startswith(".forte-staging-") for name in os.listdir(dest)):
            return False
    except FileNotFoundError:
        return False
    return sum(len(f) for _, _, f in os.walk(dest / site)) >= want


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


class Contenders:
    def __init__(self, inbox: Path, proxies: dict, gpg_home: Path, level: str, pull_cpu, send_args=(),
                 relay_log=None, history=False, senders=1):
        self.inbox, self.proxies, self.gpg_home, self.level = inbox, proxies, gpg_home, level
        self.pull_cpu, self.send_args, self.relay_log = pull_cpu, list(send_args), relay_log
        self.history, self.senders = history, senders

    def forte(self, out: Path, binary: Path = FORTE, level: str = None, more_args=(), catalog="edge",
              relay_args=()):
        """Every role (relay, puller, sender) runs `binary`; `level` overrides --level's first;
        `more_args` go to send after --send-args, `relay_args` to the relay; the edge catalogue
        is WORK/`catalog`.sqlite."""
        relay_dir, dest = VOLUME / "relay", fresh(out)
        shutil.rmtree(relay_dir, ignore_errors=True)
        if self.relay_log:
            self.relay_log.unlink(missing_ok=True)
        # Appending, so that the harness's own lines (below) land between the relay's.
        log = open(self.relay_log, "a", buffering=1) if self.relay_log else subprocess.DEVNULL

        def mark(what):
            if self.relay_log:
                log.write(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%S.%fZ} HARNESS {what}\n")

        relay, url, fingerprint = start_relay(binary, relay_dir, WORK / "tokens.toml", "127.0.0.1:7443", log,
                                              relay_args)
        try:
            conn = ["--relay-fingerprint", fingerprint, "--token-file"]
            edge_catalog = WORK / f"{catalog}.sqlite"
            # With --history the edge keeps its catalogue, and so its tuning history, from run to
            # run (each variant its own).
            for cat in ([] if self.history else [edge_catalog]) + [WORK / "core.sqlite"]:
                cat.unlink(missing_ok=True)
            puller = subprocess.Popen(
                [binary, "--catalog", WORK / "core.sqlite", "pull", "--watch", "--interval", "1", "--to", dest,
                 "--identity", WORK / "keys/core.key", "--trust", WORK / "keys/edge.pub",
                 *(["--trust", WORK / "keys2/edge.pub"] if self.senders > 1 else []), "--relay", url,
                 *(["--cpu", str(self.pull_cpu)] if self.pull_cpu else []),
                 *conn, WORK / "core.token", "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            start = time.monotonic()
            mark("send started")

            def send(catalog_path, keys, token):
                return subprocess.Popen(at_site(
                    [binary, "--catalog", catalog_path, "send", self.inbox, "-q",
                     "--recipient", WORK / "keys/core.pub", "--sign", WORK / keys / "edge.key",
                     "--level", level or self.level, *self.send_args, *more_args,
                     "--relay", f"https://{self.proxies['forte']}", *conn, WORK / token]),
                    stdout=subprocess.DEVNULL)

            # A second sender is a second site (its own edge key, token and catalogue) sending
            # the same data at the same time over the same link.
            second = WORK / f"{catalog}-2.sqlite"
            second.unlink(missing_ok=True)
            # With two senders, each one's bytes arriving at the relay are read every second.
            shares = SiteShares(url, (WORK / "core.token").read_text().strip()) if self.senders > 1 else None
            with shares or contextlib.nullcontext():
                sends = [send(edge_catalog, "keys", "edge.token")] + (
                    [send(second, "keys2", "edge2.token")] if self.senders > 1 else [])
                for p in sends:
                    if p.wait() != 0:
                        sys.exit(f"forte send exited with {p.returncode}")
            mark("send exited")
            want = sum(1 for p in self.inbox.rglob("*") if p.is_file() and p.name != ".ready")
            sites = ["wan", "wan2"][:self.senders]
            # Looked at every 10 ms: rsync's time is its exit, so a coarser look would add up to
            # its interval to forte's alone.
            while not all(delivered(dest, site, want) for site in sites):
                time.sleep(0.01)
            if self.senders > 1:
                if digest_tree(dest / "wan2") != digest_tree(self.inbox):
                    sys.exit("the second sender's delivery differs from the source")
                shares.report()
            elapsed = time.monotonic() - start
            mark("last file delivered")
            puller.terminate()
            puller.wait()
        finally:
            relay.terminate()
            relay.wait()
            if self.relay_log:
                log.close()
        return elapsed, dest / "wan"

    def rsync_copy(self, out: Path):
        dmz, store = fresh(VOLUME / "rsync-dmz"), fresh(out)
        start = time.monotonic()
        sh(at_site(["rsync", "-a", "--exclude", ".ready", f"{self.inbox}/",
                    f"rsync://{self.proxies['rsync']}/dmz/"]))
        rsynced = time.monotonic()
        sh(["cp", "-a", f"{dmz}/.", store])
        done = time.monotonic()
        # The legs apart: the rsync is bound by the link; the copy's time moves with the machine's
        # memory state (0.3 s to 4 s on one machine, see docs/benchmarks/log/2026-11.md).
        print(f"  rsync {rsynced - start:.1f} s, then copy {done - rsynced:.1f} s", file=sys.stderr)
        return done - start, store

    def rsync_zstd(self, setting: str):
        """`setting` is a zstd level, or LEVEL/THREADS."""
        level, _, threads = setting.partition("/")
        store = fresh(RSYNC_STORE)
        start = time.monotonic()
        sh(at_site(["rsync", "-a", "-z", "--compress-choice=zstd", f"--compress-level={level}",
                    *([f"--compress-threads={threads}"] if threads else []), "--exclude", ".ready",
                    f"{self.inbox}/", f"rsync://{self.proxies['rsync']}/store/"]))
        return time.monotonic() - start, store

    def rclone(self, out: Path):
        store = fresh(out)
        server = subprocess.Popen(["rclone", "serve", "webdav", store, "--addr", "127.0.0.1:7080"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(1)
            start = time.monotonic()
            sh(at_site(["rclone", "copy", self.inbox, ":webdav:", "--webdav-url", f"http://{self.proxies['rclone']}",
                        "--transfers", "4", "--exclude", ".ready"]), stdout=subprocess.DEVNULL)
            return time.monotonic() - start, store
        finally:
            server.terminate()
            server.wait()

    def cb_im_rsync(self, out: Path):
        staged, dmz, store = fresh(VOLUME / "cbim-staged"), fresh(VOLUME / "rsync-dmz"), fresh(out)
        env = f"export GNUPGHOME='{self.gpg_home}';"
        start = time.monotonic()
        # Edge: the pipe chain per file, two at a time; the sums go beside the results.
        sh(at_site(["bash", "-c", env + f" cd '{self.inbox}' && find . -type f ! -name .ready -print0 | "
                    "xargs -0 -P2 -I{} bash -c 'mkdir -p \"" + str(staged) + "/$(dirname {})\" && "
                    "tee < {} >(sha256sum > /dev/null) | zstd -3 -q -c | gpg -q --batch --trust-model always "
                    "-e -r forte-bench | tee \"" + str(staged) + "/{}.zst.gpg\" | sha256sum > \"" + str(staged) +
                    "/{}.sha256\"'"]))
        sh(at_site(["rsync", "-a", f"{staged}/", f"rsync://{self.proxies['rsync']}/dmz/"]))
        # Core: decrypt and decompress each file, two at a time, into storage.
        sh(["bash", "-c", env + f" cd '{dmz}' && find . -name '*.zst.gpg' -print0 | xargs -0 -P2 -I{{}} "
            f"bash -c 'f={{}}; mkdir -p \"{store}/$(dirname $f)\" && gpg -q --batch -d \"$f\" | zstd -d -q -c "
            f"> \"{store}/${{f%.zst.gpg}}\"'"])
        return time.monotonic() - start, store


def rsync_name(setting: str) -> str:
    """The contender's name for an --rsync-levels entry (LEVEL or LEVEL/THREADS)."""
    return f"rsync -z zstd {setting.replace('/', ', threads ')}"


def slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name)


def gpg_key(home: Path):
    fresh(home)
    home.chmod(0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    sh(["gpg", "-q", "--batch", "--passphrase", "", "--quick-gen-key", "forte-bench", "default", "default", "never"],
       env=env)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--link-rate", default="65MB")
    ap.add_argument("--latency-ms", type=int, default=20)
    ap.add_argument("--scale", type=float, default=0.003)
    ap.add_argument("--small", type=int, metavar="N",
                    help="send one batch of N small real files (1-64 kB C headers) instead of A-N")
    ap.add_argument("--media", type=int, metavar="MB",
                    help="send one batch of MB megabytes of incompressible 32 MB files instead of A-N "
                         "(a link-bound workload)")
    ap.add_argument("--mix", type=int, metavar="MB",
                    help="the mixed workload: A-N (--scale) plus --small files (3000 unless given) plus a "
                         "batch of MB megabytes of incompressible 32 MB files")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", help="comma-separated contenders to run")
    ap.add_argument("--level", default="3",
                    help="forte's zstd levels, comma-separated (each a number, or auto); the first is "
                         "'forte', the others 'forte level N', in the same rounds")
    ap.add_argument("--rsync-levels", default="3",
                    help="zstd levels of rsync -z, comma-separated, each LEVEL or LEVEL/THREADS; "
                         "the first is the target's (default 3, rsync's own, on one thread)")
    ap.add_argument("--pull-cpu", type=int, help="CPU budget of forte's puller (default: all cores)")
    ap.add_argument("--pin", action="store_true",
                    help="deployment-shaped: the site (every sender) on CPU 0, the data centre (relay, "
                         "puller, receivers, Toxiproxy) on CPU 1")
    ap.add_argument("--send-args", default="", help="more flags for forte send, e.g. '--connections 8'")
    ap.add_argument("--relay-log", type=Path,
                    help="write the relay's log (a line per part stored, object and batch sealed) of "
                         "forte's last run into this file, to see when the link was busy")
    ap.add_argument("--window", type=float, metavar="SECONDS",
                    help="also print each run's link rate over consecutive windows of this length "
                         "(min, median, max): whether a --bwlimit holds, or a rate recovers after a step")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                    help="also time forte with these more send flags as 'forte NAME', in the same rounds "
                         "(e.g. 'c4=--connections 4'); repeatable")
    ap.add_argument("--relay-variant", action="append", default=[], metavar="NAME=ARGS",
                    help="also time forte with these relay flags as 'forte NAME', in the same rounds "
                         "(e.g. 'tcp-split=--no-fair-shares'); repeatable")
    ap.add_argument("--history", action="store_true",
                    help="keep each forte variant's edge catalogue between rounds, so that from the second "
                         "round on send starts from its tuning history")
    ap.add_argument("--step", metavar="S:RATE,...",
                    help="change the link's rate during every run: at S seconds after its start to RATE "
                         "(tc qdisc change), e.g. '30:20MB,60:65MB'; the rate is set back at each run's start")
    ap.add_argument("--senders", type=int, default=1, choices=[1, 2],
                    help="forte only: 2 runs a second sender (a second site with its own key, token and "
                         "catalogue) with the same data at the same time over the same link, and prints "
                         "each one's share of the link over time (its bytes arriving at the relay, per 10 s)")
    ap.add_argument("--host-fs", action="store_true",
                    help="write into WORK on the host's file system instead of a fresh journaled ext4 "
                         "per run (see Storage)")
    ap.add_argument("--chart", type=Path, help="also draw the medians as a bar chart into this SVG file")
    ap.add_argument("--compare", action="append", default=[], metavar="NAME=PATH",
                    help="also time the forte build at PATH as 'forte (NAME)', in the same rounds")
    args = ap.parse_args()
    compare = dict(c.split("=", 1) for c in args.compare)
    rsync_levels = args.rsync_levels.split(",")
    for tool in ["rsync", "rclone", "gpg", "zstd"]:
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing: apt-get install {tool}")
    sh(["cargo", "build", "--release", "-q"], cwd=ROOT)
    storage = None if args.host_fs else Storage()
    if storage:
        storage.unmount()
    fresh(WORK)
    inbox = WORK / "inbox"
    if args.media:
        raw = build_incompressible_batch(inbox, args.media)
    elif args.mix:
        raw = (build_inbox(inbox, args.scale) + build_small_inbox(inbox, args.small or 3000)
               + build_incompressible_batch(inbox, args.mix))
    else:
        raw = build_small_inbox(inbox, args.small) if args.small else build_inbox(inbox, args.scale)
    make_site(FORTE, WORK, "wan")
    if args.senders > 1:
        add_edge_site(FORTE, WORK, "wan2", "keys2", "edge2.token")
    gpg_key(WORK / "gnupg")
    source = digest_tree(inbox)
    shape = ("1 batch of incompressible media" if args.media
             else "14 batches, small files and incompressible media" if args.mix
             else "1 batch of small files" if args.small else "14 batches")
    cpus = "site on CPU 0, data centre on CPU 1" if args.pin else "2 cores shared"
    print(f"data: {shape}, {len(source)} files, {raw / 1e6:.1f} MB; link {args.link_rate}, "
          f"+{args.latency_ms} ms; {cpus}", file=sys.stderr)

    if args.pin:
        # The harness and everything it starts (relay, puller, daemons) inherit CPU 1; at_site
        # moves the site's commands to CPU 0.
        SITE_CPUS.append(0)
        os.sched_setaffinity(0, {1})
    setup_link(parse_rate(args.link_rate))
    rsyncd_conf = WORK / "rsyncd.conf"
    rsyncd_conf.write_text(f"use chroot = no\nuid = root\ngid = root\n[dmz]\npath = {VOLUME}/rsync-dmz\nread only = no\n"
                           f"[store]\npath = {RSYNC_STORE}\nread only = no\n")
    daemons = [subprocess.Popen(["rsync", "--daemon", "--no-detach", "--address", "127.0.0.1", "--port", "7873",
                                 "--config", rsyncd_conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
               subprocess.Popen([toxiproxy_server(), "-host", "127.0.0.1", "-port", "8474"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        time.sleep(1)
        proxies = {
            "forte": delayed("forte", 17443, "127.0.0.1:7443", args.latency_ms),
            "rsync": delayed("rsync", 17873, "127.0.0.1:7873", args.latency_ms),
            "rclone": delayed("rclone", 17080, "127.0.0.1:7080", args.latency_ms),
        }
        forte_levels = args.level.split(",")
        c = Contenders(inbox, proxies, WORK / "gnupg", forte_levels[0], args.pull_cpu, shlex.split(args.send_args),
                       args.relay_log, args.history, args.senders)
        variants = dict(v.split("=", 1) for v in args.variant)
        contenders = {"forte": c.forte,
                      **{f"forte level {n}": (lambda out, n=n: c.forte(out, level=n)) for n in forte_levels[1:]},
                      **{f"forte {n}": (lambda out, n=n, a=a: c.forte(out, more_args=shlex.split(a), catalog=slug(n)))
                         for n, a in variants.items()},
                      **{f"forte {n}": (lambda out, a=a: c.forte(out, relay_args=shlex.split(a)))
                         for n, a in (v.split("=", 1) for v in args.relay_variant)},
                      **{f"forte ({n})": (lambda out, b=Path(b): c.forte(out, b)) for n, b in compare.items()},
                      "rsync + copy (papers' baseline)": c.rsync_copy,
                      "CB-IM + rsync": c.cb_im_rsync,
                      **{rsync_name(n): (lambda _out, n=n: c.rsync_zstd(n)) for n in rsync_levels},
                      "rclone copy": c.rclone}
        if args.only:
            keep = args.only.split(",")
            contenders = {k: v for k, v in contenders.items() if any(k.startswith(o) for o in keep)}
        times = {name: [] for name in contenders}
        sent = {name: [] for name in contenders}
        # Busy seconds of each CPU during each run: with --pin, CPU 0 is the site's and CPU 1
        # the data centre's, so a side busy for the whole run is what bounds it.
        busy = {name: [] for name in contenders}
        for r in range(args.runs):
            for name, run in contenders.items():
                if storage:
                    storage.remake()
                subprocess.run(["sync"])
                before, cpu_before = link_bytes(), cpu_busy()
                with LinkSampler() as link, RateSteps(parse_rate(args.link_rate), args.step):
                    seconds, result = run(VOLUME / "out" / slug(name))
                sent[name].append(link_bytes() - before)
                if args.window:
                    w = link.window_rates(args.window)
                    print(f"  {name}: {len(w)} whole {args.window:g}-s windows on the link: " +
                          (f"min {min(w):.1f}, median {statistics.median(w):.1f}, max {max(w):.1f} MB/s "
                           f"({', '.join(f'{r:.1f}' for r in w)})" if w else "none"), file=sys.stderr)
                busy[name].append([b - a for a, b in zip(cpu_before, cpu_busy())])
                got = digest_tree(result)
                if got != source:
                    missing = len(set(source) - set(got))
                    differ = sum(1 for k in source if k in got and got[k] != source[k])
                    sys.exit(f"{name}: result differs from the source ({missing} missing, {differ} differ)")
                times[name].append(seconds)
                print(f"round {r + 1}: {name}: {seconds:.2f} s, {raw / 1e6 / seconds:.1f} MB/s, "
                      f"{sent[name][-1] / 1e6:.0f} MB on the link, CPUs busy "
                      f"{', '.join(f'{b:.1f}' for b in busy[name][-1])} s", file=sys.stderr)
    finally:
        for d in daemons:
            d.terminate()
            d.wait()
        teardown_link()
        if storage:
            storage.unmount()

    base = statistics.median(times.get("rsync + copy (papers' baseline)", [float("nan")]))
    forte = statistics.median(times.get("forte", [float("nan")]))
    sides = "site, data centre" if args.pin else "CPU 0, CPU 1"
    print("| contender | median s | effective raw MB/s | vs rsync + copy | forte vs it | on the link: MB, "
          f"raw/link ratio, MB/s | CPU busy s ({sides}) | all runs (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, ts in times.items():
        m = statistics.median(ts)
        wire = statistics.median(sent[name])
        cpu = ", ".join(f"{statistics.median(run[i] for run in busy[name]):.1f}" for i in range(len(busy[name][0])))
        print(f"| {name} | {m:.2f} | {raw / 1e6 / m:.1f} | {base / m:.2f}× | {m / forte:.2f}× | "
              f"{wire / 1e6:.0f}, {raw / wire:.2f}, {wire / 1e6 / m:.1f} | {cpu} | "
              f"{', '.join(f'{t:.2f}' for t in ts)} |")
    if args.chart:
        rate = {name: raw / 1e6 / statistics.median(ts) for name, ts in times.items()}
        targets = [(2.5, "rsync + copy (papers' baseline)", "rsync + copy"),
                   (1.15, rsync_name(rsync_levels[0]), f"rsync -z {rsync_levels[0]}")]
        bar_chart(args.chart, f"End to end over {args.link_rate}/s + {args.latency_ms} ms, "
                  f"{raw / 1e6:.0f} MB (median of {args.runs})", "MB/s", list(rate.items()),
                  [(f * rate[name], f"{f}× {short}") for f, name, short in targets if name in rate])


if __name__ == "__main__":
    main()
