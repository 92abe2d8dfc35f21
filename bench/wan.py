#!/usr/bin/env python3
"""End to end over an emulated WAN: forte against what people use today, same data, same link.

The site (edge) runs in a network namespace; the data centre is this one. By default
(`--via emulator`) they are joined by `forte-bench wanem`, a packet-level WAN over TUN devices:
--link-rate each way (default the papers' 65 MB/s), half of --rtt-ms each way, --loss of the
packets dropped at random (in bursts of --burst), so TCP meets the real round trip and real
loss. `--rtt-ms 20,100,300,600 --loss 0,0.001,0.01` runs the grid of every pair, each
setting's rounds interleaved. `--via toxiproxy` is the older link kept for comparison: a veth
pair shaped by tbf, with Toxiproxy adding --rtt-ms to every byte the site sends (its TCP
connections are local, so no round trip or loss reaches TCP). The data is the FORTE test set's
14 batches A–N (bench/network.py's builder, --scale of the papers' 337 GB).

Contenders, each timed from start to the moment the last file is in its final place:
  forte            send (edge) → relay → pull --watch (core): encrypted, signed, verified,
                   catalogued, delivered under {site}/{batch}/{path}
  rsync + copy     the papers' baseline: rsync of the raw files to the DMZ (rsync daemon), then
                   a second copy step into storage
  CB-IM + rsync    the papers' pipe chain at the edge (sha256sum | zstd -3 | gpg -e | sha256sum,
                   two files at a time), rsync of the results, then gpg -d | zstd -d at the core
  rsync            `rsync -a` straight to storage (no compression)
  rsync -z zstd N  `rsync -z --compress-choice=zstd --compress-level=N` straight to storage
                   (what a careful admin would do; no encryption, no end-to-end check); N is
                   rsync's default 3, and --rsync-levels adds others (the first is the one the
                   issue's target is measured against); N/T also passes --compress-threads=T
                   (rsync's default is one compressing thread)
  rclone copy      `rclone copy --transfers 4` to `rclone serve webdav` at the data centre

Each role's CPU-seconds are counted (forte's edge, relay and core; rsync's and rclone's sender
and receiver) and given per GB of raw data.

Every contender's result is compared with the source (sizes and SHA-256 of every file). Runs
are interleaved (each round runs every contender once); medians are reported, with the bytes
each contender put on the link (counted on the data-centre end of the veth pair: payload plus
TCP/IP and TLS framing) and the rate they crossed it at: a contender near the link's rate is
link-bound, and only a better compression ratio makes it faster.

Needs root, rsync, rclone, gpg, zstd and Toxiproxy's server (found on PATH or in ~/go/bin);
`bench/setup.sh` installs them all. Run as root: it creates network namespaces.

Usage (as root): bench/wan.py [--link-rate 65MB] [--rtt-ms 20[,100..]] [--loss 0[,0.001..]] [--burst 1]
                 [--via emulator|toxiproxy] [--json FILE] [--scale 0.003 | --small 3000] [--runs 3]
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
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from chart import bar_chart
from corpus import build_incompressible_batch, build_inbox, build_small_inbox
from network import NS, cpu_seconds, parse_rate, set_link_rate, setup_link, teardown_link
from site_setup import add_edge_site, make_site, start_relay
from binary import FORTE

ROOT = Path(__file__).resolve().parent.parent
WANEM = ROOT / "target/release/forte-bench"
WORK = Path(os.environ.get("FORTE_BENCH_DIR", "/tmp/forte-bench")) / "wan"
DC = "10.77.0.2"  # the data-centre end of the link
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


# Where each contender's server listens on the data-centre side (every address, so that the
# emulator's device, made later, and Toxiproxy on loopback both reach it).
PORTS = {"forte": 7443, "rsync": 7873, "rclone": 7080}


class Emulated:
    """The site's namespace joined to this one by `forte-bench wanem`: the round trip and the
    loss are met by TCP itself. `set` (re)starts the emulator with a round trip and a loss."""

    device = "wanem0"  # its TUN device on each side; this side's counts what the site sent

    def __init__(self, rate: str):
        self.rate, self.proc = rate, None

    def setup(self):
        teardown_link()
        sh(["ip", "netns", "add", NS])

    def set(self, rtt_ms: float, loss: float, burst: float):
        self.stop()
        self.proc = subprocess.Popen(
            [WANEM, "wanem", "--namespaces", NS, ".", "--device", self.device, "--rtt", f"{rtt_ms:g}ms",
             "--loss", str(loss), "--burst", str(burst), "--rate", self.rate],
            stderr=subprocess.PIPE, text=True)
        line = self.proc.stderr.readline()
        if not line.startswith("wanem:"):
            sys.exit(f"the WAN emulator did not start: {line}{self.proc.stderr.read()}")
        print(f"  {line.strip()}", file=sys.stderr)
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()

    def address(self, name: str) -> str:
        return f"{DC}:{PORTS[name]}"

    def cpu(self) -> float:
        """CPU-seconds the emulator has used (it shares the machine with the contenders)."""
        return cpu_seconds(self.proc.pid)

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()
            self.proc = None

    def teardown(self):
        self.stop()
        teardown_link()


class Proxied:
    """The older link: a veth pair shaped by tbf, Toxiproxy adding the round trip to what the
    site sends (two local TCP connections: no round trip or loss reaches TCP)."""

    device = "veth-dc"

    def __init__(self, rate: str):
        self.rate, self.server = parse_rate(rate), None

    def setup(self):
        setup_link(self.rate)
        self.server = subprocess.Popen([toxiproxy_server(), "-host", "127.0.0.1", "-port", "8474"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: api("GET", "/version"), "Toxiproxy's API")

    def set(self, rtt_ms: float, loss: float, burst: float):
        if loss:
            sys.exit("Toxiproxy cannot lose packets: use --via emulator for --loss")
        for name, port in PORTS.items():
            with contextlib.suppress(urllib.error.HTTPError):
                api("DELETE", f"/proxies/{name}")
            api("POST", "/proxies", {"name": name, "listen": f"{DC}:1{port}", "upstream": f"127.0.0.1:{port}"})
            api("POST", f"/proxies/{name}/toxics",
                {"type": "latency", "stream": "upstream", "attributes": {"latency": int(rtt_ms)}})

    def address(self, name: str) -> str:
        return f"{DC}:1{PORTS[name]}"

    def cpu(self) -> float:
        return cpu_seconds(self.server.pid)

    def teardown(self):
        if self.server:
            self.server.terminate()
            self.server.wait()
        teardown_link()


def wait_for(ready, what: str, within: float = 10.0):
    """Calls `ready` until it returns without an OSError, for `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            return ready()
        except OSError:
            if time.monotonic() > deadline:
                sys.exit(f"{what} did not come up within {within:g} s")
            time.sleep(0.05)


LINK = None  # the Emulated or Proxied link of this run


def wait_cpu(proc: subprocess.Popen) -> float:
    """Waits for `proc` and returns its CPU-seconds (and its waited-for children's); fails the
    bench if it failed."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{proc.args[:8]}… exited with {proc.returncode}")
    return usage.ru_utime + usage.ru_stime


def run_at_site(cmd, **kw) -> float:
    """Runs `cmd` at the site; its CPU-seconds."""
    return wait_cpu(subprocess.Popen(at_site(cmd), **kw))


def daemon_cpu(pid: int) -> float:
    """A forking daemon's CPU-seconds with its exited children's, once no child is left (the
    rsync daemon reaps a connection's processes just after the client has gone)."""
    wait_for(lambda: _no_children(pid), "the rsync daemon's children's exit")
    return cpu_seconds(pid, children=True)


def _no_children(pid: int):
    if any(Path(f"/proc/{pid}/task/{t}/children").read_text().split() for t in os.listdir(f"/proc/{pid}/task")):
        raise OSError("children left")


def digest_tree(root: Path):
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != ".ready":
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def link_bytes() -> int:
    """Bytes the site has sent over the link so far (received at the data centre)."""
    return int(Path(f"/sys/class/net/{LINK.device}/statistics/rx_bytes").read_text())


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
    """Each contender's run returns (seconds, where the result is) and leaves in `roles` the
    CPU-seconds of each of its roles (none for the two-step baselines)."""

    def __init__(self, inbox: Path, gpg_home: Path, level: str, pull_cpu, send_args=(),
                 relay_log=None, history=False, senders=1, rsyncd=None):
        self.inbox, self.gpg_home, self.level = inbox, gpg_home, level
        self.pull_cpu, self.send_args, self.relay_log = pull_cpu, list(send_args), relay_log
        self.history, self.senders, self.rsyncd = history, senders, rsyncd
        self.roles = {}

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

        relay, url, fingerprint = start_relay(binary, relay_dir, WORK / "tokens.toml",
                                              f"0.0.0.0:{PORTS['forte']}", log, relay_args)
        try:
            conn = ["--relay-fingerprint", fingerprint, "--token-file"]
            edge_catalog = WORK / f"{catalog}.sqlite"
            # With --history the edge keeps its catalogue, and so its tuning history, from run to
            # run (each variant its own).
            for cat in ([] if self.history else [edge_catalog]) + [WORK / "core.sqlite"]:
                cat.unlink(missing_ok=True)
            puller = subprocess.Popen(
                [binary, "--catalog", WORK / "core.sqlite", "pull", "--watch", "--interval", "1", "--to", dest,
                 "--identity", WORK / "keys/core.key", "--trust", f"wan={WORK / 'keys/edge.pub'}",
                 *(["--trust", f"wan2={WORK / 'keys2/edge.pub'}"] if self.senders > 1 else []), "--relay", url,
                 *(["--cpu", str(self.pull_cpu)] if self.pull_cpu else []),
                 *conn, WORK / "core.token", "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            start = time.monotonic()
            mark("send started")

            def send(catalog_path, keys, token, site):
                return subprocess.Popen(at_site(
                    [binary, "--catalog", catalog_path, "send", self.inbox, "-q",
                     "--recipient", WORK / "keys/core.pub", "--sign", WORK / keys / "edge.key", "--site", site,
                     "--level", level or self.level, *self.send_args, *more_args,
                     "--relay", f"https://{LINK.address('forte')}", *conn, WORK / token]),
                    stdout=subprocess.DEVNULL)

            # A second sender is a second site (its own edge key, token and catalogue) sending
            # the same data at the same time over the same link.
            second = WORK / f"{catalog}-2.sqlite"
            second.unlink(missing_ok=True)
            # With two senders, each one's bytes arriving at the relay are read every second.
            shares = SiteShares(url, (WORK / "core.token").read_text().strip()) if self.senders > 1 else None
            with shares or contextlib.nullcontext():
                sends = [send(edge_catalog, "keys", "edge.token", "wan")] + (
                    [send(second, "keys2", "edge2.token", "wan2")] if self.senders > 1 else [])
                edge = sum(wait_cpu(p) for p in sends)
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
            self.roles = {"edge": edge, "relay": cpu_seconds(relay.pid), "core": cpu_seconds(puller.pid)}
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
        self.roles = {}
        start = time.monotonic()
        sh(at_site(["rsync", "-a", "--exclude", ".ready", f"{self.inbox}/",
                    f"rsync://{LINK.address('rsync')}/dmz/"]))
        rsynced = time.monotonic()
        sh(["cp", "-a", f"{dmz}/.", store])
        done = time.monotonic()
        # The legs apart: the rsync is bound by the link; the copy's time moves with the machine's
        # memory state (0.3 s to 4 s on one machine, see docs/benchmarks/log/2026-11.md).
        print(f"  rsync {rsynced - start:.1f} s, then copy {done - rsynced:.1f} s", file=sys.stderr)
        return done - start, store

    def rsync_zstd(self, setting: str = None):
        """`setting` is a zstd level, or LEVEL/THREADS; none is plain rsync (no compression)."""
        level, _, threads = (setting or "").partition("/")
        compress = (["-z", "--compress-choice=zstd", f"--compress-level={level}",
                     *([f"--compress-threads={threads}"] if threads else [])] if setting else [])
        store = fresh(RSYNC_STORE)
        receiver = daemon_cpu(self.rsyncd.pid)
        start = time.monotonic()
        sender = run_at_site(["rsync", "-a", *compress, "--exclude", ".ready",
                              f"{self.inbox}/", f"rsync://{LINK.address('rsync')}/store/"])
        elapsed = time.monotonic() - start
        self.roles = {"sender": sender, "receiver": daemon_cpu(self.rsyncd.pid) - receiver}
        return elapsed, store

    def rclone(self, out: Path):
        store = fresh(out)
        server = subprocess.Popen(["rclone", "serve", "webdav", store, "--addr", f"0.0.0.0:{PORTS['rclone']}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: urllib.request.urlopen(f"http://127.0.0.1:{PORTS['rclone']}/", timeout=1),
                     "rclone serve webdav")
            start = time.monotonic()
            sender = run_at_site(["rclone", "copy", self.inbox, ":webdav:", "--webdav-url",
                                  f"http://{LINK.address('rclone')}", "--transfers", "4", "--exclude", ".ready"],
                                 stdout=subprocess.DEVNULL)
            elapsed = time.monotonic() - start
            self.roles = {"sender": sender, "receiver": cpu_seconds(server.pid)}
            return elapsed, store
        finally:
            server.terminate()
            server.wait()

    def cb_im_rsync(self, out: Path):
        staged, dmz, store = fresh(VOLUME / "cbim-staged"), fresh(VOLUME / "rsync-dmz"), fresh(out)
        env = f"export GNUPGHOME='{self.gpg_home}';"
        self.roles = {}
        start = time.monotonic()
        # Edge: the pipe chain per file, two at a time; the sums go beside the results.
        sh(at_site(["bash", "-c", env + f" cd '{self.inbox}' && find . -type f ! -name .ready -print0 | "
                    "xargs -0 -P2 -I{} bash -c 'mkdir -p \"" + str(staged) + "/$(dirname {})\" && "
                    "tee < {} >(sha256sum > /dev/null) | zstd -3 -q -c | gpg -q --batch --trust-model always "
                    "-e -r forte-bench | tee \"" + str(staged) + "/{}.zst.gpg\" | sha256sum > \"" + str(staged) +
                    "/{}.sha256\"'"]))
        sh(at_site(["rsync", "-a", f"{staged}/", f"rsync://{LINK.address('rsync')}/dmz/"]))
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
    ap.add_argument("--rtt-ms", "--latency-ms", default="20",
                    help="round trip(s) added, comma-separated: a grid of every round trip with every --loss")
    ap.add_argument("--loss", default="0", help="fraction(s) of packets lost each way, comma-separated "
                    "(0.001 is 0.1 %%; --via emulator)")
    ap.add_argument("--burst", type=float, default=1.0, help="mean length of a burst of losses (1: independent)")
    ap.add_argument("--via", choices=["emulator", "toxiproxy"], default="emulator",
                    help="the link: forte-bench wanem (packets), or Toxiproxy (bytes; the older bench)")
    ap.add_argument("--json", type=Path, help="also write every run's figures, setting by setting, to this file")
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
    ap.add_argument("--level", default="3",  # forte send's own default
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
    ap.add_argument("--site-sysctl", action="append", default=[], metavar="KEY=VALUE",
                    help="set a sysctl in the site's namespace only (the sender's TCP), e.g. "
                         "net.ipv4.tcp_slow_start_after_idle=0 or 'net.ipv4.tcp_wmem=4096 16384 16777216'")
    ap.add_argument("--host-fs", action="store_true",
                    help="write into WORK on the host's file system instead of a fresh journaled ext4 "
                         "per run (see Storage)")
    ap.add_argument("--chart", type=Path, help="also draw the medians as a bar chart into this SVG file")
    ap.add_argument("--compare", action="append", default=[], metavar="NAME=PATH",
                    help="also time the forte build at PATH as 'forte (NAME)', in the same rounds")
    args = ap.parse_args()
    if args.step and args.via == "emulator":
        sys.exit("--step changes a tbf qdisc's rate: use it with --via toxiproxy")
    compare = dict(c.split("=", 1) for c in args.compare)
    rsync_levels = args.rsync_levels.split(",")
    for tool in ["rsync", "rclone", "gpg", "zstd"]:
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing: apt-get install {tool}")
    sh(["cargo", "build", "--release", "-q", "-p", "forte", "-p", "forte-bench"], cwd=ROOT)
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
    print(f"data: {shape}, {len(source)} files, {raw / 1e6:.1f} MB; link {args.link_rate} via {args.via}; "
          f"{cpus}", file=sys.stderr)

    if args.pin:
        # The harness and everything it starts (relay, puller, daemons) inherit CPU 1; at_site
        # moves the site's commands to CPU 0.
        SITE_CPUS.append(0)
        os.sched_setaffinity(0, {1})
    global LINK
    LINK = Emulated(args.link_rate) if args.via == "emulator" else Proxied(args.link_rate)
    LINK.setup()
    for setting in args.site_sysctl:
        sh(at_site(["sysctl", "-q", "-w", setting]))
    rsyncd_conf = WORK / "rsyncd.conf"
    rsyncd_conf.write_text(f"use chroot = no\nuid = root\ngid = root\n[dmz]\npath = {VOLUME}/rsync-dmz\nread only = no\n"
                           f"[store]\npath = {RSYNC_STORE}\nread only = no\n")
    rsyncd = subprocess.Popen(["rsync", "--daemon", "--no-detach", "--address", "0.0.0.0", "--port",
                               str(PORTS["rsync"]), "--config", rsyncd_conf],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = []
    try:
        forte_levels = args.level.split(",")
        c = Contenders(inbox, WORK / "gnupg", forte_levels[0], args.pull_cpu, shlex.split(args.send_args),
                       args.relay_log, args.history, args.senders, rsyncd)
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
                      "rsync": lambda _out: c.rsync_zstd(),
                      **{rsync_name(n): (lambda _out, n=n: c.rsync_zstd(n)) for n in rsync_levels},
                      "rclone copy": c.rclone}
        if args.only:
            keep = args.only.split(",")
            contenders = {k: v for k, v in contenders.items() if any(k == o or k.startswith(o + " ") for o in keep)}
        for rtt in map(float, args.rtt_ms.split(",")):
            for loss in map(float, args.loss.split(",")):
                LINK.set(rtt, loss, args.burst)
                setting = {"rtt_ms": rtt, "loss": loss, "burst": args.burst, "link_rate": args.link_rate,
                           "via": args.via, "raw_bytes": raw, "files": len(source), "shape": shape}
                runs = run_setting(args, contenders, c, storage, source, raw)
                results.append({**setting, "contenders": runs})
                report(setting, runs, raw, args)
                if args.json:
                    args.json.write_text(json.dumps(results, indent=1))
    finally:
        rsyncd.terminate()
        rsyncd.wait()
        LINK.teardown()
        if storage:
            storage.unmount()
    if args.chart and len(results) == 1:
        runs = results[0]["contenders"]
        rate = {name: raw / 1e6 / statistics.median(r["seconds"] for r in rs) for name, rs in runs.items()}
        targets = [(2.5, "rsync + copy (papers' baseline)", "rsync + copy"),
                   (1.15, rsync_name(rsync_levels[0]), f"rsync -z {rsync_levels[0]}")]
        bar_chart(args.chart, f"End to end over {args.link_rate}/s + {args.rtt_ms} ms, "
                  f"{raw / 1e6:.0f} MB (median of {args.runs})", "MB/s", list(rate.items()),
                  [(f * rate[name], f"{f}× {short}") for f, name, short in targets if name in rate])


def run_setting(args, contenders, c, storage, source, raw):
    """Every contender `args.runs` times, interleaved; each run's figures by contender."""
    runs = {name: [] for name in contenders}
    for r in range(args.runs):
        for name, run in contenders.items():
            if storage:
                storage.remake()
            subprocess.run(["sync"])
            before, cpu_before, link_cpu = link_bytes(), cpu_busy(), LINK.cpu()
            with LinkSampler() as link, RateSteps(parse_rate(args.link_rate), args.step):
                seconds, result = run(VOLUME / "out" / slug(name))
            wire = link_bytes() - before
            windows = link.window_rates(args.window or 5)
            busy = [b - a for a, b in zip(cpu_before, cpu_busy())]
            if args.window:
                w = windows
                print(f"  {name}: {len(w)} whole {args.window:g}-s windows on the link: " +
                      (f"min {min(w):.1f}, median {statistics.median(w):.1f}, max {max(w):.1f} MB/s "
                       f"({', '.join(f'{r:.1f}' for r in w)})" if w else "none"), file=sys.stderr)
            got = digest_tree(result)
            if got != source:
                missing = len(set(source) - set(got))
                differ = sum(1 for k in source if k in got and got[k] != source[k])
                sys.exit(f"{name}: result differs from the source ({missing} missing, {differ} differ)")
            runs[name].append({"seconds": seconds, "wire_bytes": wire, "busy": busy, "roles": c.roles,
                               "link_cpu": LINK.cpu() - link_cpu, "windows_5s": windows})
            roles = ", ".join(f"{k} {v:.1f}" for k, v in c.roles.items())
            print(f"round {r + 1}: {name}: {seconds:.2f} s, {raw / 1e6 / seconds:.1f} MB/s, "
                  f"{wire / 1e6:.0f} MB on the link at {wire / 1e6 / seconds:.1f} MB/s, CPU-s {roles or '-'}, "
                  f"CPUs busy {', '.join(f'{b:.1f}' for b in busy)} s, link {runs[name][-1]['link_cpu']:.1f} s",
                  file=sys.stderr)
    return runs


def report(setting, runs, raw, args):
    """The setting's table: medians, rates, bytes on the link, CPU per GB by role."""
    def med(rs, key):
        return statistics.median(r[key] for r in rs)

    base = runs.get("rsync + copy (papers' baseline)")
    base = med(base, "seconds") if base else float("nan")
    forte = med(runs["forte"], "seconds") if "forte" in runs else float("nan")
    sides = "site, data centre" if args.pin else "CPU 0, CPU 1"
    print(f"\n{setting['shape']}, {setting['files']} files, {raw / 1e6:.0f} MB; link {setting['link_rate']}, "
          f"RTT {setting['rtt_ms']:g} ms, loss {setting['loss'] * 100:g} % (burst {setting['burst']:g}), "
          f"via {setting['via']}; median of {args.runs}")
    print("| contender | median s | effective raw MB/s | vs rsync + copy | forte vs it | on the link: MB, "
          f"raw/link ratio, MB/s | CPU-s per GB by role | CPU busy s ({sides}) | all runs (s) |")
    print("|---|---:|---:|---:|---:|---:|---|---|---|")
    for name, rs in runs.items():
        m, wire = med(rs, "seconds"), med(rs, "wire_bytes")
        cpu = ", ".join(f"{statistics.median(r['busy'][i] for r in rs):.1f}" for i in range(len(rs[0]["busy"])))
        roles = ", ".join(f"{role} {statistics.median(r['roles'][role] for r in rs) / (raw / 1e9):.2f}"
                          for role in rs[0]["roles"]) or "-"
        print(f"| {name} | {m:.2f} | {raw / 1e6 / m:.1f} | {base / m:.2f}× | {m / forte:.2f}× | "
              f"{wire / 1e6:.0f}, {raw / wire:.2f}, {wire / 1e6 / m:.1f} | {roles} | {cpu} | "
              f"{', '.join(f'{t:.2f}' for t in (r['seconds'] for r in rs))} |", flush=True)


if __name__ == "__main__":
    main()
