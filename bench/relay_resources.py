#!/usr/bin/env python3
"""The relay's memory and connection hygiene (issue 42): what one large upload, three at once,
and a thousand connections that send nothing cost a relay, and whether sites are still served.

A. Memory. A relay (its own store, an edge token for site `bench`) takes ONE part of --size
   bytes (default 1 GiB, the largest body it accepts) over HTTPS: `PUT /v1/objects/{id}/parts/0`
   with `Authorization: Bearer`, `x-forte-sha256` and an explicit Content-Length, the body
   streamed from Python (a 4 MiB random block repeated, never held whole; its SHA-256 is
   computed before the request, for the header, and again over the bytes as they are sent).
   Then, on a relay started afresh, THREE such uploads at once (threads, other bytes each).
   The relay's peak RSS is its VmHWM (/proc/PID/status) after the uploads, checked against a
   sample of VmRSS every 20 ms. Target: under 200 MB in both cases, and every upload answered
   with a success status.

B. Idle connections. A relay under a limit of 1 024 descriptors (RLIMIT_NOFILE set before it
   starts; its /proc/PID/limits is read back), with --handshake-timeout and --idle-timeout
   shortened (3 s and 6 s by default, instead of 10 s and 30 s, to keep the run short; they
   differ so that what closed a connection shows). --connections connections (default 1 000)
   are opened from --sources loopback addresses (127.0.1.1, 127.0.1.2, ...; a list: each
   count is one variant), and held sending nothing; two kinds, each its own variant:
     tls: the TLS handshake is completed, then nothing is sent;
     tcp: a TCP connection that never starts a handshake.
   Meanwhile, every 200 ms, a site (from 127.0.0.1, another address) makes `GET /v1/site` with
   its token on a fresh connection (TCP, TLS, request), each with a 5 s timeout; its latency
   is recorded from before the connection to the answer's last byte. Target: every site
   request answered (200) within 1 s throughout. Each idle connection's life is measured from
   its TCP connect to the EOF the relay sends (or a reset); connections closed within 0.5 s
   count as refused at once (over the caps, before any handshake), the others as held. Check
   (also a target of this bench): every held connection is closed by the relay no later than
   its timeout (handshake timeout for tcp, idle timeout for tls) plus 2 s.

TLS: the client does not verify the relay's self-signed certificate against a CA (an `ssl`
context without verification); it pins it instead, as forte's client does: the SHA-256 of the
certificate the relay presents must be the fingerprint the relay printed. The idle connections
skip even that.

Prints a table per part; exits 1 when a target is missed, 2 when the bench itself failed.

Usage: bench/relay_resources.py [--binary PATH] [--size BYTES] [--connections N]
                                [--sources 1,16] [--only memory|idle]
"""

import argparse
import hashlib
import http.client
import os
import queue
import random
import resource
import selectors
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BINARY = Path(os.environ.get("FORTE_BINARY") or ROOT / "target" / "release" / "forte")
WORK = Path(os.environ.get("FORTE_BENCH_DIR", "/tmp/forte-bench")) / "relay_resources"
SITE, TOKEN = "bench", "bench-edge-token-0123456789"
BLOCK = 4 << 20
MB = 1e6
RSS_TARGET_MB = 200.0
LATENCY_TARGET_S = 1.0
RELAY_NOFILE = 1024
CLOSE_SLACK_S = 2.0
AT_ONCE_S = 0.5


# --- the relay ----------------------------------------------------------------------------------

class Relay:
    """A `forte relay` on 127.0.0.1:0 with its own store; its log goes to WORK/relay-<name>.log."""

    def __init__(self, binary, name, flags=(), nofile=None):
        store = WORK / "store"
        shutil.rmtree(store, ignore_errors=True)
        tokens = WORK / "tokens.toml"
        tokens.write_text(f'[[token]]\ntoken = "{TOKEN}"\nrole = "edge"\nsite = "{SITE}"\n')
        self.log_path = WORK / f"relay-{name}.log"
        self.log = open(self.log_path, "w")

        def limit():
            if nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            [binary, "relay", "--listen", "127.0.0.1:0", "--store", store, "--tokens", tokens,
             "--catalog", WORK / "catalog.sqlite", *flags],
            stdout=subprocess.PIPE, stderr=self.log, text=True, preexec_fn=limit)
        first = self.proc.stdout.readline()
        second = self.proc.stdout.readline()
        if not first.startswith("relay listening on"):
            self.stop()
            raise RuntimeError(f"the relay did not start: {first!r}; see {self.log_path}")
        host_port = first.split()[-1].removeprefix("https://")
        self.host, port = host_port.rsplit(":", 1)
        self.port = int(port)
        self.fingerprint = second.split()[-1].rstrip(")")
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()

    def status(self, field):
        """A field of /proc/PID/status in kB (VmRSS, VmHWM)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise KeyError(field)

    def fds(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def nofile_limit(self):
        for line in Path(f"/proc/{self.proc.pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return line.split()[3:5]
        return ["?", "?"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=35)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Sampler:
    """Samples the relay's VmRSS (and descriptors) every `every` seconds, keeping the peaks."""

    def __init__(self, relay, every=0.02, fds=False):
        self.relay, self.every, self.count_fds = relay, every, fds
        self.peak_rss_kb = 0
        self.peak_fds = 0
        self.samples = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stopping.is_set():
            try:
                self.peak_rss_kb = max(self.peak_rss_kb, self.relay.status("VmRSS"))
                if self.count_fds:
                    self.peak_fds = max(self.peak_fds, self.relay.fds())
                self.samples += 1
            except (OSError, KeyError):
                return
            time.sleep(self.every)

    def stop(self):
        self.stopping.set()
        self.thread.join()


def pinned_context():
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # self-signed: pinned below instead
    return ctx


def check_pin(conn, fingerprint):
    der = conn.sock.getpeercert(binary_form=True)
    found = hashlib.sha256(der).hexdigest()
    if found != fingerprint:
        raise ssl.SSLError(f"certificate fingerprint {found}, expected {fingerprint}")


# --- A: memory ----------------------------------------------------------------------------------

class Upload:
    """One part of `size` bytes: `block` repeated, streamed; hashed before and while sent."""

    def __init__(self, size, seed):
        self.size = size
        self.block = random.Random(seed).randbytes(BLOCK)
        self.object_id = random.Random(seed + 1_000_000).randbytes(16).hex()
        h = hashlib.sha256()
        for chunk in self.chunks():
            h.update(chunk)
        self.sha256 = h.hexdigest()
        self.sent_sha256 = None
        self.sent = 0
        self.status = None
        self.error = None
        self.seconds = None

    def chunks(self):
        whole, rest = divmod(self.size, BLOCK)
        for _ in range(whole):
            yield self.block
        if rest:
            yield self.block[:rest]

    def body(self, h):
        for chunk in self.chunks():
            h.update(chunk)
            self.sent += len(chunk)
            yield chunk

    def run(self, relay):
        started = time.monotonic()
        try:
            conn = http.client.HTTPSConnection(relay.host, relay.port, context=pinned_context(),
                                               timeout=600)
            conn.connect()
            check_pin(conn, relay.fingerprint)
            h = hashlib.sha256()
            conn.request("PUT", f"/v1/objects/{self.object_id}/parts/0", body=self.body(h),
                         headers={"Authorization": f"Bearer {TOKEN}",
                                  "x-forte-sha256": self.sha256,
                                  "Content-Length": str(self.size),
                                  "Content-Type": "application/octet-stream"})
            answer = conn.getresponse()
            text = answer.read()
            self.status = answer.status
            self.sent_sha256 = h.hexdigest()
            if not 200 <= answer.status < 300:
                self.error = text.decode(errors="replace")[:200]
            conn.close()
        except Exception as e:  # noqa: BLE001 (reported, not raised: the bench goes on)
            self.error = f"{type(e).__name__}: {e}"
        self.seconds = time.monotonic() - started

    @property
    def ok(self):
        return (self.status is not None and 200 <= self.status < 300
                and self.sent == self.size and self.sent_sha256 == self.sha256)


def memory_case(binary, size, uploads_at_once, seed):
    uploads = [Upload(size, seed + i) for i in range(uploads_at_once)]
    relay = Relay(binary, f"memory-{uploads_at_once}")
    try:
        idle_rss = relay.status("VmRSS")
        sampler = Sampler(relay)
        threads = [threading.Thread(target=u.run, args=(relay,)) for u in uploads]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - started
        time.sleep(0.1)
        sampler.stop()
        hwm = relay.status("VmHWM")
        alive = relay.proc.poll() is None
    finally:
        relay.stop()
        shutil.rmtree(WORK / "store", ignore_errors=True)
    return {
        "uploads": uploads, "idle_rss_mb": idle_rss * 1024 / MB, "hwm_mb": hwm * 1024 / MB,
        "sampled_mb": sampler.peak_rss_kb * 1024 / MB, "samples": sampler.samples,
        "wall": wall, "alive": alive,
    }


def run_memory(args):
    print(f"A. memory: one upload of {args.size} bytes, then three at once "
          f"(relay restarted between; target peak RSS < {RSS_TARGET_MB:.0f} MB)", flush=True)
    rows, missed = [], []
    for n in (1, 3):
        r = memory_case(args.binary, args.size, n, seed=n * 10)
        ups = r["uploads"]
        statuses = ",".join(str(u.status) for u in ups)
        ok = all(u.ok for u in ups)
        rate = n * args.size / r["wall"] / MB
        rows.append([f"{n} × {args.size / MB:.0f} MB", statuses, "yes" if ok else "NO",
                     f"{r['wall']:.1f}", f"{rate:.0f}", f"{r['idle_rss_mb']:.0f}",
                     f"{r['sampled_mb']:.0f}", f"{r['hwm_mb']:.0f}",
                     "met" if r["hwm_mb"] < RSS_TARGET_MB else "MISSED"])
        for u in ups:
            if not u.ok:
                missed.append(f"upload of {u.object_id} ({n} at once): status {u.status}, "
                              f"{u.sent} of {u.size} bytes sent, "
                              f"SHA-256 {'as announced' if u.sent_sha256 == u.sha256 else 'differs'}"
                              f"{': ' + u.error if u.error else ''}")
        if r["hwm_mb"] >= RSS_TARGET_MB:
            missed.append(f"{n} upload(s) at once: relay peak RSS {r['hwm_mb']:.0f} MB "
                          f">= {RSS_TARGET_MB:.0f} MB")
        if not r["alive"]:
            missed.append(f"{n} upload(s) at once: the relay died (see {WORK}/relay-memory-{n}.log)")
    table(["uploads at once", "HTTP status", "all 2xx, SHA-256 sent = announced", "wall s",
           "MB/s", "RSS idle MB", "RSS peak sampled (20 ms) MB", "VmHWM MB", "< 200 MB"], rows)
    return missed


# --- B: idle connections ------------------------------------------------------------------------

class Probe:
    """The site's requests: GET /v1/site with its token, each on a fresh connection, every
    `every` seconds (each in its own thread, so a slow one does not delay the next)."""

    def __init__(self, relay, every=0.2, timeout=5.0):
        self.relay, self.every, self.timeout = relay, every, timeout
        self.results = []  # (start offset s, latency s, ok, error)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.started = time.monotonic()
        self.workers = []
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def one(self):
        t0 = time.monotonic()
        ok, error = False, None
        try:
            conn = http.client.HTTPSConnection(self.relay.host, self.relay.port,
                                               source_address=("127.0.0.1", 0),
                                               context=pinned_context(), timeout=self.timeout)
            conn.connect()
            check_pin(conn, self.relay.fingerprint)
            conn.request("GET", "/v1/site", headers={"Authorization": f"Bearer {TOKEN}"})
            answer = conn.getresponse()
            body = answer.read()
            ok = answer.status == 200 and SITE.encode() in body
            if not ok:
                error = f"HTTP {answer.status}"
            conn.close()
        except Exception as e:  # noqa: BLE001
            error = type(e).__name__ + (f": {e}" if str(e) else "")
        latency = time.monotonic() - t0
        with self.lock:
            self.results.append((t0 - self.started, latency, ok, error))

    def run(self):
        next_at = time.monotonic()
        while not self.stopping.is_set():
            w = threading.Thread(target=self.one, daemon=True)
            w.start()
            self.workers.append(w)
            next_at += self.every
            self.stopping.wait(max(0.0, next_at - time.monotonic()))

    def stop(self):
        self.stopping.set()
        self.thread.join()
        for w in self.workers:
            w.join(self.timeout + 1)
        return sorted(self.results)


class Idle:
    """One connection that sends nothing; `closed` is its life, connect to EOF."""
    __slots__ = ("sock", "connected", "ready", "closed", "how")

    def __init__(self):
        self.sock = None
        self.connected = None
        self.ready = None
        self.closed = None
        self.how = None


def open_idle(relay, kind, n, sources, watch):
    """Opens n connections from `sources` addresses, 24 at a time; each is handed to `watch`
    once open (or recorded closed if the relay refused it during the handshake)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    todo = queue.Queue()
    for i in range(n):
        todo.put(i)
    conns = [Idle() for _ in range(n)]

    def worker():
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            c = conns[i]
            src = f"127.0.1.{1 + i % sources}"
            try:
                raw = socket.create_connection((relay.host, relay.port), timeout=10,
                                               source_address=(src, 0))
            except OSError as e:
                c.closed, c.how = 0.0, f"connect failed: {type(e).__name__}"
                continue
            c.connected = time.monotonic()
            if kind == "tls":
                try:
                    s = ctx.wrap_socket(raw, do_handshake_on_connect=False)
                    s.do_handshake()
                    c.sock = s
                except (OSError, ssl.SSLError) as e:
                    c.closed = time.monotonic() - c.connected
                    c.how = f"handshake refused ({type(e).__name__})"
                    raw.close()
                    continue
            else:
                c.sock = raw
            c.ready = time.monotonic()
            c.sock.setblocking(False)
            watch(c)

    threads = [threading.Thread(target=worker) for _ in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return conns


class Watcher:
    """Waits for EOF (or a reset) on every idle connection, and records when it came."""

    def __init__(self):
        self.sel = selectors.DefaultSelector()
        self.incoming = queue.Queue()
        self.open = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def watch(self, c):
        self.incoming.put(c)

    def run(self):
        while not self.stopping.is_set():
            while True:
                try:
                    c = self.incoming.get_nowait()
                except queue.Empty:
                    break
                self.sel.register(c.sock, selectors.EVENT_READ, c)
                self.open += 1
            for key, _ in self.sel.select(timeout=0.02):
                c = key.data
                try:
                    data = c.sock.recv(4096)
                except (ssl.SSLWantReadError, BlockingIOError):
                    continue  # TLS records that carry no data (session tickets)
                except (OSError, ssl.SSLError) as e:
                    data, c.how = b"", f"reset ({type(e).__name__})"
                if data:
                    continue  # the relay sent something: not a close
                c.closed = time.monotonic() - c.connected
                c.how = c.how or "EOF"
                self.sel.unregister(c.sock)
                c.sock.close()
                self.open -= 1

    def stop(self):
        self.stopping.set()
        self.thread.join()
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()


def idle_case(args, kind, sources):
    flags = ["--handshake-timeout", f"{args.handshake_timeout}s",
             "--idle-timeout", f"{args.idle_timeout}s"]
    relay = Relay(args.binary, f"idle-{kind}-{sources}", flags, nofile=RELAY_NOFILE)
    timeout = args.idle_timeout if kind == "tls" else args.handshake_timeout
    try:
        limit = relay.nofile_limit()
        sampler = Sampler(relay, every=0.1, fds=True)
        probe = Probe(relay)
        time.sleep(1.0)  # the site alone first
        watcher = Watcher()
        opened_at = time.monotonic()
        conns = open_idle(relay, kind, args.connections, sources, watcher.watch)
        opening = time.monotonic() - opened_at
        held_at_most = watcher.open
        # Hold until the relay closed every one, or the timeout and some more passed.
        deadline = time.monotonic() + timeout + CLOSE_SLACK_S + 6
        while time.monotonic() < deadline and (watcher.open > 0 or not watcher.incoming.empty()):
            time.sleep(0.05)
        still_open = watcher.open
        time.sleep(1.0)  # the site alone after
        results = probe.stop()
        watcher.stop()
        sampler.stop()
    finally:
        relay.stop()
    return {"conns": conns, "results": results, "limit": limit, "opening": opening,
            "held_at_most": held_at_most, "still_open": still_open, "timeout": timeout,
            "peak_fds": sampler.peak_fds, "peak_rss_mb": sampler.peak_rss_kb * 1024 / MB}


def run_idle(args):
    print(f"\nB. idle connections: {args.connections} per variant, relay under "
          f"RLIMIT_NOFILE {RELAY_NOFILE}, --handshake-timeout {args.handshake_timeout}s "
          f"--idle-timeout {args.idle_timeout}s (defaults 10s, 30s); a site's GET /v1/site "
          f"every 200 ms (target: each answered within {LATENCY_TARGET_S:.0f} s)", flush=True)
    rows, closes, missed, errors = [], [], [], []
    for kind in ("tls", "tcp"):
        for sources in args.sources:
            r = idle_case(args, kind, sources)
            name = f"{kind}, {sources} address{'es' if sources > 1 else ''}"
            res = r["results"]
            lat = [l for _, l, ok, _ in res if ok]
            failed = [x for x in res if not x[2]]
            slow = [x for x in res if x[2] and x[1] > LATENCY_TARGET_S]
            met = not failed and not slow and res
            rows.append([name, str(len(res)), str(len(failed)), str(len(slow)),
                         f"{statistics.median(lat) * 1000:.0f}" if lat else "-",
                         f"{max(lat) * 1000:.0f}" if lat else "-",
                         f"{r['peak_fds']}", "/".join(r["limit"]), f"{r['peak_rss_mb']:.0f}",
                         "met" if met else "MISSED"])
            if not met:
                first = failed[0] if failed else slow[0]
                last = failed[-1] if failed else slow[-1]
                missed.append(f"{name}: {len(failed)} site requests failed, {len(slow)} slower than "
                              f"1 s, of {len(res)} (first at {first[0]:.1f} s, last at "
                              f"{last[0]:.1f} s into the run: {first[3] or 'slow'})")
            for t0, l, ok, err in failed[:1]:
                errors.append(f"{name}: first failed site request: {err}")
            conns = r["conns"]
            at_once = [c for c in conns if c.closed is not None and c.closed < AT_ONCE_S]
            held = [c for c in conns if c.closed is None or c.closed >= AT_ONCE_S]
            lives = sorted(c.closed for c in held if c.closed is not None)
            never = [c for c in held if c.closed is None]
            late = [x for x in lives if x > r["timeout"] + CLOSE_SLACK_S]
            early = [x for x in lives if x < r["timeout"] - 0.5]
            ok_close = not never and not late
            closes.append([name, f"{r['opening']:.1f}", str(len(at_once)), str(len(held)),
                           f"{r['timeout']} s",
                           f"{lives[0]:.2f}" if lives else "-",
                           f"{statistics.median(lives):.2f}" if lives else "-",
                           f"{lives[-1]:.2f}" if lives else "-",
                           str(len(early)), str(len(late) + len(never)),
                           "met" if ok_close else "MISSED"])
            if not ok_close:
                missed.append(f"{name}: {len(never)} held connections still open "
                              f"{r['timeout'] + CLOSE_SLACK_S + 6:.0f} s after opening, "
                              f"{len(late)} closed later than the timeout + {CLOSE_SLACK_S:.0f} s")
            hows = {}
            for c in conns:
                hows[c.how] = hows.get(c.how, 0) + 1
            errors.append(f"{name}: how the idle connections ended: "
                          + ", ".join(f"{v} {k}" for k, v in sorted(hows.items(), key=str)))
    table(["variant", "site requests", "failed", "> 1 s", "median ms", "max ms",
           "relay fds peak", "relay nofile soft/hard", "relay RSS peak MB", "within 1 s"], rows)
    print()
    table(["variant", "opening s", "closed at once (< 0.5 s)", "held", "its timeout",
           "life min s", "median s", "max s", "closed before timeout − 0.5 s",
           f"open past timeout + {CLOSE_SLACK_S:.0f} s", "closed in time"], closes)
    for e in errors:
        print("  " + e)
    return missed


# --- output -------------------------------------------------------------------------------------

def table(head, rows):
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--binary", type=Path, default=DEFAULT_BINARY,
                   help="forte binary (default: FORTE_BINARY or target/release/forte)")
    p.add_argument("--size", type=int, default=1 << 30,
                   help="bytes of each upload (default 1 GiB, the relay's largest body)")
    p.add_argument("--connections", type=int, default=1000, help="idle connections per variant")
    p.add_argument("--sources", default="1,16",
                   help="comma-separated counts of loopback addresses the idle connections come "
                        "from, one variant each (default 1,16: 64 per address are held by default)")
    p.add_argument("--handshake-timeout", type=int, default=3, help="seconds (relay default 10)")
    p.add_argument("--idle-timeout", type=int, default=6, help="seconds (relay default 30)")
    p.add_argument("--only", choices=["memory", "idle"])
    args = p.parse_args()
    args.sources = [int(s) for s in args.sources.split(",")]
    if not args.binary.exists():
        sys.exit(f"no binary at {args.binary}: cargo build --release -p forte")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.connections + 256
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
        if min(want, hard) < want:
            print(f"warning: this process may open only {hard} descriptors", file=sys.stderr)
    WORK.mkdir(parents=True, exist_ok=True)
    print(f"binary {args.binary}; work directory {WORK}", flush=True)
    missed = []
    started = time.monotonic()
    try:
        if args.only in (None, "memory"):
            missed += run_memory(args)
        if args.only in (None, "idle"):
            missed += run_idle(args)
    except RuntimeError as e:
        print(f"bench failed: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"\n{time.monotonic() - started:.0f} s in all")
    if missed:
        print("targets missed:")
        for m in missed:
            print("  - " + m)
        sys.exit(1)
    print("every target met")


if __name__ == "__main__":
    main()
