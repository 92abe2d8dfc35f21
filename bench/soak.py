#!/usr/bin/env python3
"""Soak: a stream of batches through edge → relay → core under random faults, for --minutes.

Runs a relay, a watching puller and a watching sender. The sender reaches the relay through a
fault proxy, and so does the puller. Meanwhile:

- a generator drops a new batch into the inbox every few seconds (1–8 files of 4 kB–6 MB,
  random bytes or text), each marked ready;
- the proxies inject random faults: connection resets, links throttled to a few kB/s, stalls
  longer than the request timeout, outages of several seconds;
- random kill -9 of the sender, the puller or the relay, each restarted after a pause;
- one-shot `forte send` runs between the watching sender's lives (a re-run must not rewrite
  what the catalogue knows);
- a hostile relay store: an object of a sealed batch removed for a while (omission), or an
  object of one sealed batch listed in another (injection), both undone after a few seconds;
  the core must refuse the batch meanwhile (its signed inventory names the object);
- a relay quota (`--quota-per-site`), so the store fills and senders wait for the core; once,
  a batch larger than the quota, which must fail fast (413) and is cancelled with
  `send --cancel` (it must never arrive);
- with --hostile, the relay operator's attacks on custody (issue 41), at random: a sealed batch
  relabelled into another site's namespace (its records rewritten to match; that site shares
  the edge key, and the core trusts the key for both sites) and moved back later; a delivered
  batch replayed from a copy of the store taken before delivery, its tombstones removed; a
  sealed batch dropped whole, for good; an acknowledgement forged with the core's token
  (no receipt). The sender deletes sources (`--delete-after-ack`) only under receipts it
  verifies;
- a core task (`[[task]] at = "core"`, per batch) on every batch at the core: it reads the
  landed files, starts a background `sleep 300` and a `setsid` one, and sleeps 1–4.5 s in a loop;
  its processes carry a marker in their command line. At random, while a try runs (found with
  `pgrep -f` of the marker), the puller is killed with -9: within 5 s no process holding the
  marker may be left (the try's background jobs included);
- about one batch in eight is named `…-tamper`: its task appends to one landed file, deletes
  another, adds a file and a symlink, and exits 0. Verified promotion must quarantine it: such
  a batch is expected in the quarantine (catalogue state `quarantined`,
  `DEST/.forte-quarantine/soak/ID/` with a `forte-reason.txt` saying the task changed the
  batch), never delivered, and none of its files may ever be in the destination;
- versions over time (issue 57), always: a file of a batch already sent (before or after the
  core delivered it) rewritten (a new file of another size renamed over it) or appended to in
  place; its expected bytes become its current bytes (a file changes again only once its
  current version arrived). Once, the puller is stopped, its catalogue moved away (kept as
  core-old-N.sqlite) and it starts with a fresh one; once, the same for the sender
  (edge-old-N.sqlite), when no change is on its way (a change the old catalogue sealed and the
  core has not delivered would collide with the new catalogue's generation 1: docs/threat-model.md,
  "What survives what"). With --hostile, the relay operator's moves on a batch's history, one at
  a time, each holding the core's link down until the edge has sealed a batch not yet
  delivered: a rollback (the store's records of the sealed batch copied, a file of it changed,
  and once the newer instance is delivered the copy put back, its tombstones removed, the relay
  restarted: the older must never be delivered over the newer, and the puller says
  "superseded"); a reorder (a file of the sealed batch changed while the core cannot reach the
  relay; once the edge sealed the newer instance its seal, inventory and new objects are moved
  aside and the older put back, so the core is offered the older first; some seconds later the
  store is put back as it was: the current version must arrive). The custody moves above leave
  such batches alone, and these leave theirs;
- SIGHUP and SIGTERM to each daemon (the watching sender, the watching puller, the relay), in
  a shuffled round of every pair: after SIGHUP the daemon must still run (the relay reloads
  tokens.toml, the puller its trusted keys; each logs it); after SIGTERM it must exit with
  status 0 within its grace (`--shutdown-grace`, --grace s, 10 by default), timed from the
  signal to the exit, and is started again after a pause, as after a kill. A daemon that ends
  by itself otherwise is a failure (and is restarted).

With --hostile it also checks: nothing delivered under the other site, no replay delivered
again (each file delivered once in the core's lineage), every receipt the core signed verifies
(`forte receipts`), and no source deleted that was not delivered; a batch whose
acknowledgement was forged is withheld by the relay for good (the relay deleted it and refuses
it again, and the edge keeps its sources): counted apart, not lost.

Then the generator stops, the faults stop, and the soak waits until everything is delivered.
It checks every file of every batch: arrived exactly once, byte-identical (SHA-256), no file
outside the expected set, every delivered batch complete, no staging directory left behind,
the relay empty after acknowledgement, and the core's catalogues (the current one and those
replaced) acknowledging exactly the files on disk. A changed file's expected bytes are its last
ones: one that holds other bytes is a stale version delivered (as is its current version found
under DEST/.forte-replaced); every earlier version the lineage says was delivered must be kept
under .forte-replaced, and nothing else may be there; the lineage may show a file in several
versions, each once. No batch may be left sealed at the relay with an object it offers (stuck),
and every receipt of every core catalogue must verify. The tampered batches are left out of those counts: each must be
quarantined, and none of their files in the destination, let alone differing from the source;
the summary also says how many of their files the quarantine keeps as verified (a tampering
task changes the quarantined copy too), and, with --hostile, how many the edge deleted at its
source (under the quarantined batch's receipt) that the quarantine does not keep as verified:
lost. Then the daemons get their last SIGTERM, and it checks: no process of the core task left
(/proc), no landing directory left (nor staging), every SIGTERM answered with status 0 within
the grace (per daemon: how many, the slowest, how many ran the grace out), no daemon stopped
by SIGHUP or ended by itself. It prints a summary with the counts and exits 1 on any failure.

The forte binary: --binary PATH, else FORTE_BINARY, else this tree's release build (built
first with cargo; a binary given either way is run as it is). Work directory:
$FORTE_BENCH_DIR/soak (default /tmp/forte-bench/soak).

Usage: bench/soak.py [--minutes 30] [--seed N] [--quota 96MiB] [--hostile] [--binary PATH] [--grace 10]
                     [--settle 1800]
"""

import argparse
import hashlib
import os
import json
import random
import shutil
import sqlite3
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from site_setup import add_edge_site, make_site, start_relay
import binary

FORTE = binary.FORTE

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(os.environ.get("FORTE_BENCH_DIR", "/tmp/forte-bench")) / "soak"


class FaultProxy:
    """TCP proxy whose live connections can be reset, throttled, stalled, or refused."""

    def __init__(self, target_port):
        self.target = ("127.0.0.1", target_port)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.mode = ("none", 0)
        self.generation = 0
        # Held down by a move of the soak's own (the seals reordered), whatever the faults say.
        self.held = False
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def set(self, mode, arg=0):
        with self.lock:
            self.mode = (mode, arg)
            if mode == "down":
                self.generation += 1

    def reset_all(self):
        with self.lock:
            self.generation += 1

    def hold(self, down):
        """Holds the link down (every connection cut, none accepted) until released."""
        with self.lock:
            self.held = down
            self.generation += 1

    def _accept(self):
        while True:
            client, _ = self.sock.accept()
            if self.mode[0] == "down" or self.held:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            born = self.generation
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b, born), daemon=True).start()

    def _pump(self, src, dst, born):
        src.settimeout(0.05)
        try:
            while self.generation == born:
                mode, arg = self.mode
                if mode == "stall":
                    time.sleep(0.05)
                    continue
                size = max(1, arg // 20) if mode == "throttle" else 65536
                try:
                    data = src.recv(size)
                except socket.timeout:
                    continue
                if not data:
                    break
                dst.sendall(data)
                if mode == "throttle":
                    time.sleep(0.05)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def parse_size(text):
    """`96MiB`, `64MB`, `1000` → bytes."""
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "kB": 1000, "MB": 10**6, "GB": 10**9, "B": 1}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def tamper_store(rng, store, aside, skip=frozenset()):
    """Removes an object of a sealed batch from the relay's store, or lists it in another
    sealed batch, as a hostile relay could. Returns the kind and a function undoing it, or None
    when there is nothing to tamper with. Batches in `skip` (ids a move of versions over time
    has copied or hidden) are left alone."""
    batches = {}
    for record in (store / "batches").glob("*.json"):
        if record.name.endswith((".acking.json",)) or record.stem in skip:
            continue
        try:
            ids = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        held = [i for i in ids if (store / "meta" / i / "sealed.json").exists()]
        if held:
            batches[record.stem] = (record, held)
    if not batches:
        return None
    name = rng.choice(sorted(batches))
    record, held = batches[name]
    victim = rng.choice(held)
    others = [b for b in batches if b != name]
    if others and rng.random() < 0.5:
        # Injection: the victim's seal says it belongs to another batch, which lists it too.
        target = rng.choice(others)
        target_record = batches[target][0]
        sealed = store / "meta" / victim / "sealed.json"
        try:
            old_sealed, old_target = sealed.read_text(), target_record.read_text()
            doc = json.loads(old_sealed)
            doc["batch"] = target
            sealed.write_text(json.dumps(doc))
            target_record.write_text(json.dumps(json.loads(old_target) + [victim]))
        except (OSError, ValueError):
            return None

        def restore():
            for path, text in ((sealed, old_sealed), (target_record, old_target)):
                if path.parent.exists():
                    path.write_text(text)
        return "injections", restore
    # Omission: the object's data and records disappear for a while.
    moved = []
    for kind in ("objects", "meta"):
        src = store / kind / victim
        dst = aside / kind / victim
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(src, dst)
            moved.append((src, dst))
        except OSError:
            pass

    def restore():
        for src, dst in moved:
            try:
                os.rename(dst, src)
            except OSError:
                pass
    return "omissions", restore


def sealed_batches(store):
    """Sealed batch records of a site's store: batch id → the object ids it lists."""
    found = {}
    for record in (store / "batches").glob("*.json"):
        if record.name.endswith(".acking.json"):
            continue
        try:
            found[record.stem] = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
    return found


def put_back_copy(copy, path):
    """Puts the operator's `copy` of a store record or object back at `path`, whole: copied
    beside the store first, then renamed into place, so the relay (deleting what it delivered
    meanwhile) never sees, nor races, a half-copied directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not copy.is_dir():
        staged = copy.with_name(copy.name + f".staged-{time.monotonic_ns()}")
        shutil.copy(copy, staged)
        os.replace(staged, path)
        return
    staged = copy.with_name(copy.name + f".staged-{time.monotonic_ns()}")
    shutil.copytree(copy, staged, copy_function=shutil.copy)
    shutil.rmtree(path, ignore_errors=True)
    os.rename(staged, path)


def batch_paths(store, batch, ids):
    """Everything of one sealed batch in a site's store: its seal, its inventory, and each
    object's data and records."""
    paths = [store / "batches" / f"{batch}.json", store / "batches" / f"{batch}.inventory.age"]
    for i in ids:
        paths += [store / "objects" / i, store / "meta" / i]
    return [p for p in paths if p.exists()]


def relabel(path, from_site, to_site):
    """Rewrites the relay's JSON records under `path` to name another site."""
    files = [path] if path.is_file() else [p for p in path.rglob("*.json")]
    for f in files:
        if f.suffix == ".json":
            f.write_text(f.read_text().replace(f'"{from_site}"', f'"{to_site}"'))


def batch_name(work, batch_id):
    """The name of the edge's batch the relay knows as `batch_id`, from the edge's catalogue
    (or one it had before it was replaced mid-run)."""
    for catalogue in [work / "edge.sqlite", *sorted(work.glob("edge-old-*.sqlite"))]:
        try:
            with sqlite3.connect(f"file:{catalogue}?mode=ro", uri=True) as db:
                row = db.execute("SELECT name FROM batches WHERE batch_key = ?", (batch_id,)).fetchone()
            if row:
                return row[0]
        except sqlite3.Error:
            continue
    return None


def batch_id_of(work, name):
    """The relay's id of the edge's batch `name` (derived from the edge key: the same in every
    catalogue of the edge), or None while no catalogue knows it."""
    for catalogue in [work / "edge.sqlite", *sorted(work.glob("edge-old-*.sqlite"))]:
        try:
            with sqlite3.connect(f"file:{catalogue}?mode=ro", uri=True) as db:
                row = db.execute("SELECT batch_key FROM batches WHERE name = ?", (name,)).fetchone()
            if row:
                return row[0]
        except sqlite3.Error:
            continue
    return None


def edge_state(work, name):
    """The state of batch `name` in the edge's current catalogue (None: not known to it)."""
    try:
        with sqlite3.connect(f"file:{work / 'edge.sqlite'}?mode=ro", uri=True) as db:
            row = db.execute("SELECT state FROM batches WHERE name = ?", (name,)).fetchone()
        return row[0] if row else None
    except sqlite3.Error:
        return None


def hostile_act(rng, store, other, aside, core_token, url_port, fingerprint, counts, skip=lambda b: False):
    """One of the relay operator's attacks on custody. Returns (when, undo) or None. A batch
    `skip` names (one whose files changed, or that a move of versions over time holds) is left
    alone, and a batch chosen here is never changed after (`counts["hostile_ids"]`)."""
    batches = sealed_batches(store)
    ready = {b: ids for b, ids in batches.items()
             if ids and all((store / "meta" / i / "sealed.json").exists() for i in ids) and not skip(b)}
    kind = rng.choice(["relabel", "replay", "drop", "forge"])
    if not ready:
        return None
    batch = rng.choice(sorted(ready))
    ids = ready[batch]
    counts["hostile_ids"].add(batch)
    if kind == "relabel":
        moved = []
        for p in batch_paths(store, batch, ids):
            dst = other / p.relative_to(store)
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(p, dst)
            except OSError:
                continue
            relabel(dst, "soak", "other")
            moved.append((p, dst))
        counts["relabelled"] += 1

        def undo():
            for src, dst in moved:
                if not dst.exists():
                    continue
                if src.exists():
                    # The edge sent it again meanwhile (the relay had lost it): the relabelled
                    # copy is dropped.
                    shutil.rmtree(dst, ignore_errors=True) if dst.is_dir() else dst.unlink()
                    continue
                relabel(dst, "other", "soak")
                os.rename(dst, src)
        return rng.uniform(5, 20), undo
    if kind == "replay":
        copy = aside / f"replay-{batch}-{time.monotonic_ns()}"
        kept = []
        for p in batch_paths(store, batch, ids):
            dst = copy / p.relative_to(store)
            dst.parent.mkdir(parents=True, exist_ok=True)
            if p.is_dir():
                shutil.copytree(p, dst)
            else:
                shutil.copy2(p, dst)
            kept.append((p, dst))

        def undo():
            # Only once the batch was delivered: its seal is gone. A downstream user moves the
            # delivered copy away (so a replay delivered again would show), then the operator
            # puts the copy back, and removes the tombstones that would let the relay drop it.
            if (store / "batches" / f"{batch}.json").exists():
                return False
            name = batch_name(WORK, batch)
            delivered = WORK / "dest" / "soak" / (name or "?")
            if not name or not delivered.exists():
                return False
            moved = WORK / "moved" / name
            moved.parent.mkdir(parents=True, exist_ok=True)
            os.rename(delivered, moved)
            counts["replayed_names"].append(name)
            for src, dst in kept:
                put_back_copy(dst, src)
            for i in ids:
                (store / "acked" / i).unlink(missing_ok=True)
            counts["replayed"] += 1
            return True
        return rng.uniform(30, 90), undo
    if kind == "drop":
        for p in batch_paths(store, batch, ids):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        counts["dropped"] += 1
        return None
    # Forge: acknowledge the batch with the core's token, as the core would, without a receipt.
    body = json.dumps({"objects": ids})
    answer = subprocess.run(["curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
                             "-H", f"Authorization: Bearer {core_token}", "-H", "content-type: application/json",
                             "--data", body, f"https://127.0.0.1:{url_port}/v1/sites/soak/batches/{batch}/ack"],
                            capture_output=True, text=True)
    if answer.stdout == "204":
        counts["forged"] += 1
        counts["forged_batches"].append(batch)
    return None


TASK_SCRIPT = r"""#!/bin/bash
# The soak's core task ({marker}): reads the landed batch, leaves two background processes
# behind (a plain one and a setsid one, which must die with the try), tampers with a batch
# whose name says so, and sleeps in a loop for a few seconds.
(exec -a {marker}-grandchild sleep 300) &
setsid bash -c 'exec -a {marker}-setsid sleep 300' &
cd "$FORTE_BATCH_DIR" || exit 2
mapfile -d '' files < "$FORTE_FILES"
for f in "${{files[@]}}"; do cat -- "$f" > /dev/null || exit 2; done
case "$FORTE_BATCH" in
  *{tamper}*)
    # Change the landed batch and say nothing: append to one file, delete another, add a
    # file and a symlink (as root the read-only modes do not stop it; as another user they
    # are put back first).
    first=${{files[0]}}
    dir=$(dirname -- "$first")
    chmod u+w -- "$first" "$dir" 2>/dev/null
    printf 'tampered by the task\n' >> "$first"
    if [ ${{#files[@]}} -gt 1 ]; then rm -f -- "${{files[-1]}}"; fi
    printf 'added by the task\n' > "$dir/added-by-task.txt"
    ln -s /etc/passwd "$dir/passwd"
    ;;
esac
for i in $(seq $((RANDOM % 8 + 2))); do sleep 0.5; done
exit 0
"""

TAMPER = "-tamper"


def marked_processes(marker):
    """Processes whose command line holds `marker`, read from /proc: (pid, command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append((int(entry.name), cmdline.strip()))
    return found


def task_running(marker):
    """Whether a try of the soak's core task runs now (`pgrep -f` of its marker)."""
    return subprocess.run(["pgrep", "-f", marker], stdout=subprocess.DEVNULL).returncode == 0


def wait_gone(marker, within):
    """Waits up to `within` s for every process holding `marker` to end: (seconds it took,
    those left)."""
    start = time.monotonic()
    while True:
        left = marked_processes(marker)
        if not left or time.monotonic() - start > within:
            return time.monotonic() - start, left
        time.sleep(0.05)


def main():
    global FORTE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--hostile", action="store_true", help="the relay operator's attacks on custody")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--quota", default="96MiB", help="the relay's --quota-per-site")
    ap.add_argument("--binary", type=Path,
                    help="the forte binary to run (default: FORTE_BINARY, else this tree's release build, "
                         "built first); a binary given either way is run as it is, never built")
    ap.add_argument("--grace", type=float, default=10, help="--shutdown-grace of every daemon, seconds")
    ap.add_argument("--settle", type=float, default=1800,
                    help="the longest wait, seconds, for everything to arrive once the generation stops")
    args = ap.parse_args()
    rng = random.Random(args.seed)

    if args.binary:
        FORTE = args.binary.resolve()
    elif not os.environ.get("FORTE_BINARY"):
        subprocess.run(["cargo", "build", "--release", "-q"], cwd=ROOT, check=True)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    inbox, dest = WORK / "inbox", WORK / "dest"
    inbox.mkdir()
    make_site(FORTE, WORK, "soak")
    # A second site the operator relabels batches into; it shares the edge key (the core trusts
    # the key for both sites), so only the signed site tells them apart.
    add_edge_site(FORTE, WORK, "other", "keys-other", "other.token")

    # The core task: a marker in its command line (the script's name) finds its processes.
    marker = f"forte-soak-task-{os.getpid()}"
    script = WORK / f"{marker}.sh"
    script.write_text(TASK_SCRIPT.format(marker=marker, tamper=TAMPER))
    (WORK / "core.toml").write_text(
        f'[[task]]\nname = "soak-check"\nat = "core"\nper = "batch"\n'
        f'command = ["bash", "{script}"]\ntimeout = "60s"\n')
    grace = f"{args.grace:g}s"

    relay_port = free_port()
    procs = {}
    started = {}  # daemon → when its current process started
    logs = {name: open(WORK / f"{name}.log", "ab") for name in ("relay", "send", "pull")}
    fingerprint = None

    def restart_relay():
        nonlocal fingerprint
        procs["relay"], _, fingerprint = start_relay(FORTE, WORK / "relay", WORK / "tokens.toml",
                                                     f"127.0.0.1:{relay_port}", stderr=logs["relay"],
                                                     flags=["--quota-per-site", args.quota,
                                                            "--shutdown-grace", grace])
        started["relay"] = time.monotonic()

    restart_relay()
    edge_proxy, core_proxy = FaultProxy(relay_port), FaultProxy(relay_port)

    def conn(proxy, token):
        return ["--relay", f"https://127.0.0.1:{proxy.port}", "--relay-fingerprint", fingerprint,
                "--token-file", WORK / token, "--timeout", "10"]

    def send_args(*extra):
        return [FORTE, "--catalog", WORK / "edge.sqlite", "send", inbox, *extra,
                "--recipient", WORK / "keys/core.pub", "--sign", WORK / "keys/edge.key", "--part-size", "2MiB",
                "--receipt-pub", WORK / "keys/receipt.pub", "--site", "soak",
                *conn(edge_proxy, "edge.token")]

    def start_send():
        deleting = ["--delete-after-ack"] if args.hostile else []
        procs["send"] = subprocess.Popen(send_args("--watch", "--interval", "1", "--shutdown-grace", grace,
                                                   *deleting),
                                         stdout=logs["send"], stderr=logs["send"])
        started["send"] = time.monotonic()

    def one_shot_send(*extra, timeout=180):
        try:
            return subprocess.run(send_args("-q", *extra), stdout=subprocess.PIPE, stderr=logs["send"],
                                  timeout=timeout, text=True)
        except subprocess.TimeoutExpired:
            return None

    def start_pull():
        procs["pull"] = subprocess.Popen(
            [FORTE, "--config", WORK / "core.toml", "--catalog", WORK / "core.sqlite", "pull", "--watch",
             "--interval", "1", "--to", dest, "--shutdown-grace", grace,
             "--identity", WORK / "keys/core.key", "--trust", f"soak={WORK / 'keys/edge.pub'}",
             "--trust", f"other={WORK / 'keys/edge.pub'}", "--receipt-key", WORK / "keys/receipt.key",
             "--gap-alert-after", "60s",
             *conn(core_proxy, "core.token")], stdout=logs["pull"], stderr=logs["pull"])
        started["pull"] = time.monotonic()

    starters = {"relay": restart_relay, "send": start_send, "pull": start_pull}
    start_send()
    start_pull()

    expected = {}  # relative path under dest → sha256
    counts = {"batches": 0, "files": 0, "bytes": 0, "resets": 0, "throttles": 0, "stalls": 0, "outages": 0,
              "kills": {"send": 0, "pull": 0, "relay": 0}, "reruns": 0, "omissions": 0, "injections": 0,
              "too_large": 0, "relabelled": 0, "replayed": 0, "dropped": 0, "forged": 0,
              "forged_batches": [], "replayed_names": [], "task_kills": 0, "task_kill_misses": 0,
              "hups": {"send": 0, "pull": 0, "relay": 0},
              "hostile_ids": set(), "rewrites": 0, "appends": 0, "append_races": 0, "rollbacks": 0,
              "reorders": 0, "moves_abandoned": 0, "store_restarts": 0,
              "catalogues_replaced": {"pull": 0, "send": 0}}
    batch_files = {}  # batch name → its expected relative paths
    tampered = {}  # name of a batch its task tampers with → {relative path: sha256}
    left_after_kill = []  # (seconds, processes) of task processes alive 5 s after their puller died
    vanish = []  # seconds the task processes took to end after their puller died
    terms = []  # (daemon, exit status, seconds from SIGTERM to exit, the final stop?)
    hup_deaths = []  # (daemon, exit status, its age when signalled)
    unexpected = []  # (daemon, exit status, its age): a daemon that ended by itself
    hunting = None  # until when a kill -9 of the puller waits for a task to run
    deck = []  # (daemon, signal) still to send in this round: every pair once per round
    store = WORK / "relay" / "sites" / "soak"
    aside = WORK / "aside"
    undo = []  # (when, function) of store tampering to undo
    too_large = None
    text = (ROOT / "README.md").read_bytes()
    end = time.monotonic() + args.minutes * 60
    next_batch = next_fault = next_kill = time.monotonic()
    next_tamper, next_rerun = next_batch + 30, next_batch + 45
    next_hostile = next_batch + 20
    next_task_kill, next_signal = next_batch + 15, next_batch + 10

    def stop_term(victim, final=False):
        """SIGTERM to a daemon: it must exit 0 within its grace. Records the exit and the time."""
        proc = procs[victim]
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            status = proc.wait(timeout=args.grace + 20)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            status = "still running"
        terms.append((victim, status, time.monotonic() - sent, final))

    def task_check_after(victim):
        """After the puller died: its task processes must all end with it."""
        took, left = wait_gone(marker, 5)
        if left:
            left_after_kill.append((victim, left))
        else:
            vanish.append(took)
    # Versions over time (issue 57): files changed after their send, older instances replayed
    # and reordered at the relay, catalogues replaced mid-run.
    versions = {}  # relative path under dest of a changed file → its versions' SHA-256, oldest first
    changed_names = set()  # batches with a file changed after their send
    reserved = set()  # batches a move below holds (its store copied, a seal hidden): left alone
    moves = []  # [when, step] of moves under way; a step returns the seconds to its next, or None
    rollbacks = []  # (batch, path, its current SHA-256 when the older instance was put back)
    reorders = []  # (batch, path, whether the older instance was delivered before the newer)
    hashes = {}  # path → ((inode, size, mtime), SHA-256) of files at the destination
    quiet = {"until_settled": False}  # no change while the edge's catalogue waits to be replaced

    def dest_hash(rel, root=None):
        path = (root or dest) / rel
        try:
            st = path.stat()
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            if hashes.get(str(path), (None,))[0] != key:
                hashes[str(path)] = (key, sha256(path))
            return hashes[str(path)][1]
        except OSError:
            return None

    def settled(rel):
        """Whether the destination holds the current version of `rel`."""
        return dest_hash(rel) == expected[rel]

    def changeable():
        """Batches a file of which may change now: sent (the edge's catalogue says so), none of
        the relay operator's custody moves on it, not tampered with nor held by a move."""
        try:
            with sqlite3.connect(f"file:{WORK / 'edge.sqlite'}?mode=ro", uri=True) as db:
                rows = db.execute("SELECT name, batch_key, state FROM batches").fetchall()
        except sqlite3.Error:
            return []
        return sorted(name for name, key, state in rows
                      if name in batch_files and name not in tampered and name not in reserved
                      and name not in counts["replayed_names"] and key not in counts["hostile_ids"]
                      and state in ("sent", "source_kept", "source_deleted", "delivered", "acknowledged"))

    def change_file(name, kind=None):
        """Rewrites (a new file of another size renamed over it) or appends to (in place) a file
        of batch `name` still at the edge, and makes its new bytes the expected ones. A file
        changed before is changed again only once its current version arrived. Returns the
        file's path under dest, or None."""
        candidates = [f for f in sorted((inbox / name / "data").glob("*.bin"))
                      if f"soak/{name}/data/{f.name}" in expected
                      and (f"soak/{name}/data/{f.name}" not in versions or settled(f"soak/{name}/data/{f.name}"))]
        if not candidates:
            return None
        f = rng.choice(candidates)
        rel = f"soak/{name}/data/{f.name}"
        kind = kind or rng.choice(["rewrite", "append"])
        if kind == "rewrite":
            try:
                old_size = f.stat().st_size
            except OSError:
                return None
            size = rng.choice([4_000, 60_000, 700_000, 2_500_000])
            size += 1_000 if size == old_size else 0
            data = os.urandom(size) if rng.random() < 0.5 else (text * (size // len(text) + 1))[:size]
            tmp = WORK / "changing.tmp"
            tmp.write_bytes(data)
            os.rename(tmp, f)
            new = hashlib.sha256(data).hexdigest()
        else:
            try:
                old = f.read_bytes()
                fd = os.open(f, os.O_WRONLY | os.O_APPEND)
            except OSError:
                return None
            try:
                if os.fstat(fd).st_size != len(old):
                    return None
                more = os.urandom(rng.choice([100, 20_000, 400_000]))
                view = memoryview(more)
                while view:
                    view = view[os.write(fd, view):]
                inode = os.fstat(fd).st_ino
            finally:
                os.close(fd)
            new = hashlib.sha256(old + more).hexdigest()
            try:
                raced = os.stat(f).st_ino != inode
            except OSError:
                raced = True
            if raced:
                # The edge had it under its hidden name, deleting it under a receipt: it puts
                # it back (its check saw the append) or deleted it (the append came after).
                time.sleep(3)
                if not f.exists() or sha256(f) != new:
                    counts["append_races"] += 1
                    return None
        versions.setdefault(rel, [expected[rel]]).append(new)
        expected[rel] = new
        changed_names.add(name)
        counts["rewrites" if kind == "rewrite" else "appends"] += 1
        return rel

    def restart_relay_now():
        """The relay restarted (kill -9) so that it reads what was put back in its store."""
        procs["relay"].send_signal(signal.SIGKILL)
        procs["relay"].wait()
        counts["store_restarts"] += 1
        restart_relay()

    def copy_out(paths, to):
        """Copies a batch's records and objects out of the store: [(where, the copy)]."""
        kept = []
        for path in paths:
            dst = to / path.relative_to(store)
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                if path.is_dir():
                    shutil.copytree(path, dst)
                else:
                    shutil.copy2(path, dst)
            except (OSError, shutil.Error):
                continue
            kept.append((path, dst))
        return kept

    def put_back(kept, missing_only=False):
        for src, dst in kept:
            if missing_only and src.exists():
                continue
            put_back_copy(dst, src)

    def sealed_unsent():
        """Changeable batches sealed at the relay (every object sealed), not being
        acknowledged, nothing of them at the destination yet: (id, name, object ids)."""
        names = set(changeable())
        found = []
        for bid, ids in sealed_batches(store).items():
            if not ids or (store / "batches" / f"{bid}.acking.json").exists():
                continue
            if not all((store / "meta" / i / "sealed.json").exists() for i in ids):
                continue
            name = batch_name(WORK, bid)
            if name in names and not (dest / "soak" / name).exists():
                found.append((bid, name, ids))
        return found

    def until_gone(bid, name, began):
        """A move's last step: it holds its batch until the relay holds no seal of it."""
        def step():
            if (store / "batches" / f"{bid}.json").exists() and time.monotonic() - began < 600:
                return 5
            reserved.discard(name)
            return None
        return step

    def with_candidate(then):
        """Holds the core's link down (so a batch stays sealed and undelivered) until the
        edge has sealed one that may change, for at most 20 s; then `then(found)` (which
        releases the link when it needs to)."""
        core_proxy.hold(True)
        since = time.monotonic()

        def step():
            found = sealed_unsent()
            if found:
                then(rng.choice(found))
                return None
            if time.monotonic() - since > 20:
                core_proxy.hold(False)
                return None
            return 1
        moves.append([time.monotonic() + 1, step])

    def start_rollback():
        with_candidate(rollback)

    def rollback(candidate):
        """Replaying a snapshot of an older instance: the store's records of a sealed batch
        copied, a file of it changed (the edge seals a newer instance), and once that one is
        delivered, the copy put back (its tombstones removed, the relay restarted)."""
        bid, name, ids = candidate
        reserved.add(name)
        kept = copy_out(batch_paths(store, bid, ids), aside / f"rollback-{bid}-{time.monotonic_ns()}")
        rel = change_file(name)
        core_proxy.hold(False)
        if rel is None:
            reserved.discard(name)
            return
        began = time.monotonic()

        def step():
            if (store / "batches" / f"{bid}.json").exists() or not settled(rel):
                if time.monotonic() - began > 900:
                    counts["moves_abandoned"] += 1
                    reserved.discard(name)
                    return None
                return 3
            put_back(kept)
            for i in ids:
                (store / "acked" / i).unlink(missing_ok=True)
            restart_relay_now()
            rollbacks.append((name, rel, expected[rel]))
            counts["rollbacks"] += 1
            print(f"rollback: {name}: the older instance put back after {rel} arrived", file=sys.stderr)
            moves.append([time.monotonic() + 5, until_gone(bid, name, time.monotonic())])
            return None
        moves.append([time.monotonic() + 3, step])

    def start_reorder():
        with_candidate(reorder)

    def reorder(candidate):
        """Reordering seals: while the core cannot reach the relay, a file of a sealed batch
        changes; once the edge sealed the newer instance, its seal and inventory are moved
        aside and the older ones put back, so the core is offered the older first; some
        seconds later the newer seal is put back."""
        bid, name, ids = candidate
        reserved.add(name)
        record, inventory = store / "batches" / f"{bid}.json", store / "batches" / f"{bid}.inventory.age"
        copy = aside / f"reorder-{bid}-{time.monotonic_ns()}"
        older = copy_out(batch_paths(store, bid, ids), copy / "older")
        try:
            older_inventory = inventory.read_bytes()
        except OSError:
            older_inventory = None
        rel = change_file(name) if older_inventory else None
        if rel is None:
            core_proxy.hold(False)
            reserved.discard(name)
            return
        older_hash = versions[rel][-2]
        state = {"began": time.monotonic(), "hidden": []}

        def wait_newer():
            try:
                newer_inventory = inventory.read_bytes()
                newer_ids = json.loads(record.read_text())
            except (OSError, ValueError):
                newer_inventory = None
            if (newer_inventory in (None, older_inventory)
                    or (store / "batches" / f"{bid}.acking.json").exists()
                    or not all((store / "meta" / i / "sealed.json").exists() for i in newer_ids)):
                if time.monotonic() - state["began"] > 120:
                    core_proxy.hold(False)
                    counts["moves_abandoned"] += 1
                    reserved.discard(name)
                    return None
                return 1
            # The newer seal hidden with its objects the older has not, the older put back
            # (with any object of it the relay deleted since): the store as it was before.
            hide = [record, inventory] + [store / kind / i for i in newer_ids if i not in ids
                                          for kind in ("objects", "meta")]
            for path in hide:
                if not path.exists():
                    continue
                aside_path = copy / "newer" / path.relative_to(store)
                aside_path.parent.mkdir(parents=True, exist_ok=True)
                os.rename(path, aside_path)
                state["hidden"].append((path, aside_path))
            state["put_back"] = [(src, dst) for src, dst in older if not src.exists()]
            put_back(older, missing_only=True)
            restart_relay_now()
            core_proxy.hold(False)
            state["offered"] = time.monotonic()
            moves.append([time.monotonic() + 2, offered])
            return None

        def offered():
            if record.exists() and time.monotonic() - state["offered"] < 25:
                return 2
            while (store / "batches" / f"{bid}.acking.json").exists() and time.monotonic() - state["offered"] < 60:
                time.sleep(0.5)
            older_first = dest_hash(rel) == older_hash
            # What was put back of the older and is still there goes again (the relay had
            # deleted it when the newer was sealed), then the newer comes back.
            for src, _ in state["put_back"]:
                if src.exists() and src.parent.name in ("objects", "meta"):
                    shutil.rmtree(src, ignore_errors=True)
            restore_hidden()
            restart_relay_now()
            reorders.append((name, rel, older_first))
            counts["reorders"] += 1
            print(f"reorder: {name}: the newer seal put back (the older delivered first: {older_first})",
                  file=sys.stderr)
            moves.append([time.monotonic() + 5, until_gone(bid, name, time.monotonic())])
            return None

        def restore_hidden():
            for path, aside_path in state["hidden"]:
                path.parent.mkdir(parents=True, exist_ok=True)
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                os.replace(aside_path, path)
            state["hidden"] = []
        moves.append([time.monotonic() + 1, wait_newer])

    core_catalogues = [WORK / "core.sqlite"]  # the current one, then those replaced mid-run

    def replace_catalogue(who):
        """Stops the puller or the sender (SIGTERM), moves its catalogue away (kept for the
        report) and starts it again with a fresh one."""
        stop_term(who)
        if who == "pull":
            task_check_after("pull (SIGTERM)")
        base = "core" if who == "pull" else "edge"
        n = len(list(WORK.glob(f"{base}-old-*.sqlite"))) + 1
        for suffix in ("", "-wal", "-shm"):
            src = WORK / f"{base}.sqlite{suffix}"
            if src.exists():
                os.rename(src, WORK / f"{base}-old-{n}.sqlite{suffix}")
        if who == "pull":
            core_catalogues.append(WORK / f"{base}-old-{n}.sqlite")
        elif too_large is not None:
            # The new catalogue does not know the batch was cancelled: the operator says so again.
            one_shot_send("--cancel", too_large, timeout=120)
        counts["catalogues_replaced"][who] += 1
        print(f"{who}: catalogue replaced ({base}-old-{n}.sqlite kept)", file=sys.stderr)
        starters[who]()

    def run_moves():
        now = time.monotonic()
        for move in [m for m in moves if m[0] <= now]:
            after = move[1]()
            if after is None:
                moves.remove(move)
            else:
                move[0] = time.monotonic() + after

    started_at = time.monotonic()
    next_change = started_at + 25
    next_version_move = started_at + 40
    replace_core_at = started_at + args.minutes * 60 * 0.3
    replace_edge_at = started_at + args.minutes * 60 * 0.65
    next_settle_check = 0
    print(f"soak for {args.minutes:g} min, seed {args.seed}, work in {WORK}", file=sys.stderr)
    while time.monotonic() < end:
        now = time.monotonic()
        if now >= next_batch:
            # Some batches are marked for the core task to tamper with: quarantined, never
            # delivered.
            name = f"batch-{counts['batches']:05d}" + (TAMPER if rng.random() < 0.12 else "")
            staged = WORK / f"staging-{name}"
            for i in range(rng.randint(1, 8)):
                size = rng.choice([4_000, 60_000, 700_000, 2_500_000, 6_000_000])
                data = os.urandom(size) if rng.random() < 0.5 else (text * (size // len(text) + 1))[:size]
                rel = f"data/{i:02d}.bin"
                (staged / "data").mkdir(parents=True, exist_ok=True)
                (staged / rel).write_bytes(data)
                expected[f"soak/{name}/{rel}"] = hashlib.sha256(data).hexdigest()
                counts["files"] += 1
                counts["bytes"] += size
            batch_files[name] = {p for p in expected if p.startswith(f"soak/{name}/")}
            if TAMPER in name:
                tampered[name] = {p: expected.pop(p) for p in batch_files[name]}
            os.rename(staged, inbox / name)
            (inbox / name / ".ready").touch()
            counts["batches"] += 1
            next_batch = now + rng.uniform(1, 6)
        if too_large is None and now >= end - args.minutes * 30:
            # Half-way: one batch larger than the relay's quota. It must fail fast and, once
            # cancelled, never arrive; the others must go on.
            too_large = "too-large"
            big = inbox / too_large
            big.mkdir()
            quota = parse_size(args.quota)
            for i in range(3):
                (big / f"{i}.bin").write_bytes(os.urandom(quota // 2))
            (big / ".ready").touch()
            counts["too_large"] += 1
            def cancel():
                # As an operator would: stop the watching sender, cancel, start it again.
                procs["send"].send_signal(signal.SIGKILL)
                procs["send"].wait()
                one_shot_send("--cancel", too_large, timeout=120)
                start_send()
            undo.append((now + 20, cancel))
        for when, action in [u for u in undo if u[0] <= now]:
            undo.remove((when, action))
            if action() is False:
                # Not yet: a replay waits for its batch to be delivered first.
                undo.append((now + 10, action))
        if args.hostile and now >= next_hostile:
            core_token = (WORK / "core.token").read_text()
            act = hostile_act(rng, store, WORK / "relay" / "sites" / "other", aside, core_token, relay_port,
                              fingerprint, counts,
                              skip=lambda b: batch_name(WORK, b) in changed_names | reserved)
            if act:
                delay, action = act
                undo.append((now + delay, action))
            next_hostile = now + rng.uniform(15, 45)
        if now >= next_tamper:
            tamper = tamper_store(rng, store, aside, skip={batch_id_of(WORK, n) for n in reserved})
            if tamper:
                kind, restore = tamper
                counts[kind] += 1
                undo.append((now + rng.uniform(4, 15), restore))
            next_tamper = now + rng.uniform(20, 60)
        run_moves()
        if now >= next_change and not quiet["until_settled"]:
            # A file changed after its send (before or after the core delivered it).
            names = changeable()
            if names:
                change_file(rng.choice(names))
            next_change = now + rng.uniform(8, 30)
        if args.hostile and now >= next_version_move and not moves and not quiet["until_settled"]:
            rng.choice([start_rollback, start_reorder])()
            next_version_move = time.monotonic() + rng.uniform(30, 70)
        if replace_core_at is not None and now >= replace_core_at:
            replace_catalogue("pull")
            replace_core_at = None
        if replace_edge_at is not None and now >= replace_edge_at:
            # Only once no change is on its way and no move runs: a change sealed by the old
            # catalogue and not delivered would collide with the new catalogue's generation 1
            # (docs/threat-model.md, "What survives what").
            quiet.setdefault("since", now)
            quiet["until_settled"] = True
            if now - quiet["since"] > 300:
                # A change that never arrived: the end's checks name it.
                print("send: catalogue not replaced: a change did not arrive within 300 s", file=sys.stderr)
                replace_edge_at, quiet["until_settled"] = None, False
            elif not moves and now >= next_settle_check:
                next_settle_check = now + 5
                if all(settled(rel) for rel in versions):
                    replace_catalogue("send")
                    replace_edge_at, quiet["until_settled"] = None, False
        if now >= next_rerun:
            procs["send"].send_signal(signal.SIGKILL)
            procs["send"].wait()
            one_shot_send()
            counts["reruns"] += 1
            start_send()
            next_rerun = now + rng.uniform(40, 120)
        if now >= next_fault:
            proxy = rng.choice([edge_proxy, core_proxy])
            fault = rng.choice(["reset", "throttle", "stall", "down"])
            if fault == "reset":
                proxy.reset_all()
                counts["resets"] += 1
            else:
                proxy.set(fault, rng.choice([5_000, 50_000, 500_000]))
                counts[{"throttle": "throttles", "stall": "stalls", "down": "outages"}[fault]] += 1
                hold = rng.uniform(2, 25 if fault == "stall" else 10)
                threading.Timer(hold, lambda p=proxy: p.set("none")).start()
            next_fault = now + rng.uniform(5, 30)
        if now >= next_task_kill and hunting is None:
            hunting = now + 20
        if hunting is not None and task_running(marker):
            # kill -9 of the puller while its core task runs: every process of the try (the
            # task, its background job, its setsid job) must die with it.
            procs["pull"].send_signal(signal.SIGKILL)
            procs["pull"].wait()
            counts["task_kills"] += 1
            task_check_after("pull (kill -9)")
            time.sleep(rng.uniform(0.5, 5))
            start_pull()
            hunting, next_task_kill = None, now + rng.uniform(20, 60)
        elif hunting is not None and now >= hunting:
            counts["task_kill_misses"] += 1
            hunting, next_task_kill = None, now + rng.uniform(10, 30)
        if now >= next_signal:
            if not deck:
                deck = [(d, s) for d in ("send", "pull", "relay") for s in ("HUP", "TERM")]
                rng.shuffle(deck)
            victim, sig = deck.pop()
            if sig == "HUP":
                # SIGHUP reloads (the relay its tokens, the puller its trusted keys) and stops
                # nothing.
                age = now - started[victim]
                procs[victim].send_signal(signal.SIGHUP)
                counts["hups"][victim] += 1
                time.sleep(1)
                if procs[victim].poll() is not None:
                    hup_deaths.append((victim, procs[victim].returncode, age))
                    starters[victim]()
            else:
                stop_term(victim)
                if victim == "pull":
                    task_check_after("pull (SIGTERM)")
                time.sleep(rng.uniform(0.5, 5))
                starters[victim]()
            next_signal = time.monotonic() + rng.uniform(10, 30)
        for victim, proc in list(procs.items()):
            if proc.poll() is not None:
                # Nothing stops a daemon but the soak: one that ended by itself is a failure.
                unexpected.append((victim, proc.returncode, time.monotonic() - started[victim]))
                starters[victim]()
        if now >= next_kill:
            victim = rng.choice(["send", "pull", "relay"])
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            counts["kills"][victim] += 1
            if victim == "pull":
                task_check_after("pull (kill -9)")
            time.sleep(rng.uniform(0.5, 5))
            starters[victim]()
            next_kill = now + rng.uniform(20, 90)
        time.sleep(0.2)

    for _, action in sorted(undo, key=lambda u: u[0]):
        action()
    edge_proxy.set("none")
    core_proxy.set("none")
    print(f"generation over: {counts}; waiting for delivery", file=sys.stderr)

    # A batch whose acknowledgement was forged is gone from the relay for good (it refuses
    # the same objects again) while the edge keeps its sources: withheld, counted apart.
    forged_names = {batch_name(WORK, b) for b in counts["forged_batches"]} - {None}
    withheld = {p for n in forged_names for p in batch_files.get(n, ())}
    replayed_again = []

    def delivered():
        found = {}
        for root in (dest, WORK / "moved"):
            if not root.exists():
                continue
            for dirpath, dirnames, files in os.walk(root):
                # Staging, the landing zone and the quarantine are not delivered.
                dirnames[:] = [d for d in dirnames if not d.startswith(".forte-")]
                for f in files:
                    p = Path(dirpath) / f
                    rel = str(p.relative_to(root))
                    if root == dest and rel.split("/")[1:2] and rel.split("/")[1] in counts["replayed_names"]:
                        replayed_again.append(rel)
                    rel = rel if root == dest else f"soak/{rel}"
                    found[rel] = p
        return found

    def quarantined_names():
        # In the current catalogue or one replaced mid-run.
        found = set()
        for catalogue in core_catalogues:
            try:
                with sqlite3.connect(catalogue) as db:
                    found |= {r[0] for r in db.execute("SELECT name FROM batches WHERE state = 'quarantined'")}
            except sqlite3.Error:
                pass
        return found

    def relay_seals():
        """Batches the relay still holds sealed with an object it offers, waiting for the core
        (a forged one aside). A seal record whose objects are all gone (one the operator put
        back after its batch was delivered) offers nothing: counted apart."""
        return sorted(b for b, ids in sealed_batches(store).items()
                      if b not in counts["forged_batches"]
                      and any((store / "meta" / i / "sealed.json").exists() for i in ids))

    def daemons_alive():
        for victim, proc in list(procs.items()):
            if proc.poll() is not None:
                unexpected.append((victim, proc.returncode, time.monotonic() - started[victim]))
                starters[victim]()

    # A tampered batch is done once quarantined (unless its acknowledgement was forged).
    awaited_quarantine = set(tampered) - forged_names
    deadline = time.monotonic() + args.settle
    # Waits for what must arrive; a batch whose acknowledgement was forged may have arrived
    # anyway (the forgery raced its delivery), and anything else extra is counted below.
    while ((not set(expected) - withheld <= set(delivered()) or not awaited_quarantine <= quarantined_names()
            or moves or not all(settled(rel) for rel in versions if rel not in withheld) or relay_seals())
           and time.monotonic() < deadline):
        time.sleep(2)
        daemons_alive()
        run_moves()
        # An object the store lost for good (removed while the relay was restarted) comes
        # back only from the edge: a one-shot send finds what the relay lacks and seals again.
        if time.monotonic() > deadline - args.settle + 300 and int(time.monotonic()) % 60 < 2:
            one_shot_send(timeout=120)
    core_proxy.hold(False)
    found = delivered()
    missing = sorted(set(expected) - set(found) - withheld)
    withheld_arrived = sorted(withheld & set(found))
    replayed_again = sorted(set(replayed_again))
    other_site = sorted(str(p) for p in (dest / "other").rglob("*") if p.is_file()) if (dest / "other").exists() else []
    # Sources deleted at the edge: each must have arrived (its receipt said so).
    deleted_unsent = sorted(p for p in expected if not (inbox / p.split("/", 1)[1]).exists() and p not in found)
    # Every receipt of every catalogue the core had (the current one and those replaced).
    receipt_lines, receipts_ok = [], True
    for catalogue in core_catalogues:
        receipts = subprocess.run([FORTE, "--catalog", catalogue, "receipts", "--receipt-pub",
                                   WORK / "keys/receipt.pub", "--json"], capture_output=True, text=True)
        lines = [json.loads(line) for line in receipts.stdout.splitlines() if line.strip()]
        receipt_lines += lines
        receipts_ok = receipts_ok and receipts.returncode == 0 and all(r["verified"] for r in lines)
    extra = sorted(set(found) - set(expected))
    corrupt = sorted(p for p in expected if p in found and p not in versions and sha256(found[p]) != expected[p])
    # A changed file at the destination that is not its current version: a stale version delivered.
    stale = sorted(p for p in versions if p in found and dest_hash(p) != expected[p])
    # What the core kept under .forte-replaced: each an earlier version of its file; the
    # current version kept there means a stale one was delivered over it.
    replaced_root = dest / ".forte-replaced"
    kept_versions, kept_wrong = {}, []
    for f in sorted(replaced_root.rglob("*")) if replaced_root.exists() else []:
        if not f.is_file():
            continue
        rel = str(f.relative_to(replaced_root))
        base = rel.rsplit(".~", 1)[0] if rel.endswith("~") else rel
        digest = sha256(f)
        kept_versions.setdefault(base, set()).add(digest)
        if base in versions and digest == versions[base][-1]:
            kept_wrong.append(f"{rel}: the current version, replaced by a stale one")
            stale.append(base)
        elif base not in versions or digest not in versions[base]:
            kept_wrong.append(f"{rel}: no version of the file")
    stale = sorted(set(stale))
    # The lineage of every core catalogue: the versions of each changed file it delivered,
    # each version once; every earlier one delivered must be kept under .forte-replaced.
    lineage = {}  # path → [(catalogue, SHA-256, state)]
    catalogued_paths = set()
    for catalogue in core_catalogues:
        with sqlite3.connect(catalogue) as db:
            for site, name, path, digest, state in db.execute(
                    "SELECT b.site, b.name, f.path, f.raw_sha256, f.state FROM files f "
                    "JOIN batches b ON b.batch_key = f.batch_key AND b.role = 'core'"):
                rel = f"{site}/{name}/{path}"
                lineage.setdefault(rel, []).append((catalogue.name, digest, state))
                # A catalogue replaced mid-run never learns the acknowledgements given after
                # it was retired (the new one acknowledges its batches as delivered before,
                # from the record beside the destination): a file it delivered counts, and
                # one never acknowledged at all is still at the relay, which is checked.
                retired = catalogue != core_catalogues[0]
                if state == "acknowledged" or (retired and state == "delivered"):
                    catalogued_paths.add(rel)
    delivered_versions = {p: {d for _, d, _ in lineage.get(p, [])} & set(versions[p]) for p in versions}
    earlier_not_kept = sorted(f"{p} ({d[:12]})" for p, ds in delivered_versions.items() for d in ds
                              if d != versions[p][-1] and d not in kept_versions.get(p, set()))
    earlier_kept = sum(len((ds - {versions[p][-1]}) & kept_versions.get(p, set())) for p, ds in delivered_versions.items())
    twice = sorted(p for p, rows in lineage.items()
                   if len(rows) != len({(c, d) for c, d, _ in rows}))
    multi_version = sum(1 for ds in delivered_versions.values() if len(ds) > 1)
    # A batch delivered in part: some of its files present, others not.
    incomplete = sorted(b for b, files in batch_files.items()
                        if files & set(found) and not files <= set(found))
    cancelled_arrived = too_large is not None and (dest / "soak" / too_large).exists()
    relay_objects = WORK / "relay" / "sites" / "soak" / "objects"
    deadline = time.monotonic() + 300
    while relay_objects.exists() and any(relay_objects.iterdir()) and time.monotonic() < deadline:
        time.sleep(2)
    left_at_relay = len(list(relay_objects.iterdir())) if relay_objects.exists() else 0
    daemons_alive()
    tasks_before_stop = marked_processes(marker)
    for victim in ("send", "pull", "relay"):
        stop_term(victim, final=True)
    # No task process outlives its try or its puller: none holds the marker now.
    tasks_left = tasks_before_stop + marked_processes(marker)
    staging = sorted(str(d) for d in dest.rglob(".forte-staging-*") if d.is_dir()) if dest.exists() else []
    landing = dest / ".forte-landing"
    # A landing directory left: its batch id, the batches in it, whether its acknowledgement was forged.
    landing_left = sorted(f"{d} ({', '.join(b.name for b in d.glob('*/*'))}"
                          f"{'; acknowledgement forged' if d.name in counts['forged_batches'] else ''})"
                          for d in landing.glob("*/*") if d.is_dir()) if landing.exists() else []
    lists_left = sorted(str(f) for f in landing.glob(".*.files")) if landing.exists() else []

    # Tampered batches: each quarantined (catalogue, directory with the reason), none of their
    # files ever in the destination (let alone changed), and what the quarantine keeps of
    # them compared with their sources.
    quarantined = quarantined_names()
    quarantine_root = dest / ".forte-quarantine" / "soak"
    in_quarantine, reasons = {}, {}
    for kept in (quarantine_root.iterdir() if quarantine_root.exists() else []):
        reason = kept / "forte-reason.txt"
        text = reason.read_text(errors="replace") if reason.exists() else ""
        for f in kept.rglob("*"):
            parts = f.relative_to(kept).parts
            if not (f.is_file() or f.is_symlink()) or parts[0] in ("forte-output", "forte-reason.txt"):
                continue
            for i, part in enumerate(parts[:-1]):
                if part in tampered:
                    in_quarantine[f"soak/{part}/{'/'.join(parts[i + 1:])}"] = f
                    reasons[part] = text
                    break
    tampered_promoted = sorted(p for p in found if p.split("/")[1] in tampered)
    tampered_changed = sorted(p for p in tampered_promoted
                              if p not in tampered[p.split("/")[1]] or found[p].is_symlink()
                              or sha256(found[p]) != tampered[p.split("/")[1]][p])
    not_quarantined = sorted(awaited_quarantine - quarantined)
    no_reason = sorted(n for n in awaited_quarantine & quarantined if "changed the batch" not in reasons.get(n, ""))
    tampered_sources = {p: h for files in tampered.values() for p, h in files.items()}
    kept_intact = {p for p, h in tampered_sources.items()
                   if p in in_quarantine and not in_quarantine[p].is_symlink() and sha256(in_quarantine[p]) == h}
    source_gone = {p for p in tampered_sources if not (inbox / p.split("/", 1)[1]).exists()}
    # A tampered file whose source the edge deleted (under the receipt for the quarantined
    # batch) and whose verified bytes the quarantine does not hold: lost.
    tampered_lost = sorted(source_gone - kept_intact - set(found))
    tries = {}
    for catalogue in core_catalogues:
        with sqlite3.connect(catalogue) as db:
            for outcome, n in db.execute("SELECT outcome, COUNT(*) FROM task_runs GROUP BY outcome"):
                tries[outcome] = tries.get(outcome, 0) + n
    with sqlite3.connect(WORK / "core.sqlite") as db:
        # A batch the core still records as being checked by its tasks, though all stopped.
        checking = [r[0] for r in db.execute("SELECT name FROM batches WHERE state = 'checking'")]
    # Acknowledged files in the catalogues (a path in several counts once) against those on disk.
    catalogued = len(catalogued_paths)
    catalogue_differs = sorted(catalogued_paths ^ set(found))
    stuck = relay_seals()
    empty_records = sorted(set(sealed_batches(store)) - set(stuck) - set(counts["forged_batches"]))
    pull_log = (WORK / "pull.log").read_text(errors="replace")
    superseded = pull_log.count("superseded: instance")
    with sqlite3.connect(WORK / "edge.sqlite") as db:
        edge_states = dict(db.execute("SELECT state, COUNT(*) FROM batches GROUP BY state").fetchall())
    reloads = {name: (WORK / f"{name}.log").read_text(errors="replace").count(needle)
               for name, needle in (("relay", "tokens file reloaded (SIGHUP)"),
                                    ("pull", "trusted edge keys read again (SIGHUP)"),
                                    ("send", "SIGHUP: send reads its settings"))}
    # A daemon whose work outlasted the grace ends with status 0 saying so.
    ran_out = {name: (WORK / f"{name}.log").read_text(errors="replace").count("shutdown grace of")
               for name in ("send", "pull")}
    term_bad = [t for t in terms if t[1] != 0 or t[2] > args.grace + 2]
    refused = {kind: sum(log.read_text(errors="replace").count(needle)
                         for log in [WORK / "pull.log"])
               for kind, needle in (("missing", "missing: dropped on the way"),
                                    ("injected", "not in the signed inventory"))}

    minutes = args.minutes
    print(f"\nsoak: {minutes:g} min of random faults, seed {args.seed}, 2 cores")
    print(f"batches {counts['batches']}, files {counts['files']}, {counts['bytes'] / 1e6:.0f} MB")
    print(f"faults: {counts['resets']} resets, {counts['throttles']} throttles, {counts['stalls']} stalls "
          f"(up to 25 s, request timeout 10 s), {counts['outages']} outages; kill -9: "
          f"{counts['kills']['send']} sender, {counts['kills']['pull']} puller, {counts['kills']['relay']} relay")
    print(f"hostile store: {counts['omissions']} objects removed for a while, {counts['injections']} objects "
          f"listed in another batch; the core refused a batch {refused['missing']} times naming a missing "
          f"object and {refused['injected']} times naming an injected one; {counts['reruns']} one-shot sends "
          f"between the watcher's lives; {counts['too_large']} batch larger than the quota "
          f"({'arrived!' if cancelled_arrived else 'cancelled, never arrived'})")
    print(f"lost {len(missing)}, duplicated or unexpected {len(extra)}, corrupted {len(corrupt)}, "
          f"incomplete batches delivered {len(incomplete)}, left at the relay {left_at_relay}, "
          f"staging directories left {len(staging)}")
    print(f"catalogue: {catalogued} files acknowledged at the core (in {len(core_catalogues)} catalogues), "
          f"{len(found)} files on disk, {len(catalogue_differs)} in one and not the other")
    changed_files = len(versions)
    print(f"versions over time: {counts['rewrites']} rewrites and {counts['appends']} appends after the send "
          f"({counts['append_races']} appends raced with the edge deleting the file, left out) of {changed_files} "
          f"files in {len(changed_names)} batches, {sum(len(v) for v in versions.values())} versions; the lineage "
          f"shows {multi_version} files delivered in more than one version, {len(twice)} with a version twice in "
          f"one catalogue; earlier versions kept under .forte-replaced {earlier_kept} (delivered but not kept "
          f"{len(earlier_not_kept)}; kept that are no earlier version {len(kept_wrong)})")
    if args.hostile:
        print(f"versions, the relay operator's: {counts['rollbacks']} older instances put back after the newer "
              f"was delivered (rollback), {counts['reorders']} newer seals hidden so the older was offered first "
              f"({sum(1 for r in reorders if r[2])} times the older was delivered first), {counts['moves_abandoned']} "
              f"moves abandoned, {counts['store_restarts']} relay restarts for them; 'superseded' in the puller's "
              f"log {superseded} times")
    print(f"catalogues replaced mid-run: core {counts['catalogues_replaced']['pull']}, edge "
          f"{counts['catalogues_replaced']['send']}; edge batches by state at the end: "
          f"{', '.join(f'{k} {v}' for k, v in sorted(edge_states.items()))}")
    print(f"files lost {len(missing)}, stale versions delivered {len(stale)}, stuck batches {len(stuck)} "
          f"(sealed at the relay, waiting) + {left_at_relay} objects left at the relay ({len(empty_records)} seal "
          f"records left that list no object it holds), receipts "
          f"{len(receipt_lines)} ({'all verify' if receipts_ok else 'NOT ALL VERIFY'})")
    print(f"core task: tries {', '.join(f'{n} {o}' for o, n in sorted(tries.items())) or 'none'}; kill -9 of the "
          f"puller while a try ran {counts['task_kills']} ({counts['task_kill_misses']} times no try ran within "
          f"20 s); task processes alive 5 s after their puller died {len(left_after_kill)} "
          f"(slowest to end {max(vanish, default=0):.2f} s), left at the end {len(tasks_left)}")
    print(f"tampering task: {len(tampered)} batches, {len(tampered_sources)} files; quarantined "
          f"{len(awaited_quarantine & quarantined)} of {len(awaited_quarantine)} "
          f"({len(no_reason)} without 'changed the batch' in forte-reason.txt); files in the destination "
          f"{len(tampered_promoted)} ({len(tampered_changed)} differing from the source); quarantine keeps "
          f"{len(kept_intact)} of {len(tampered_sources)} files as verified, sources deleted at the edge "
          f"{len(source_gone)}, lost (source deleted, not kept as verified) {len(tampered_lost)}")
    print(f"SIGHUP: {counts['hups']['send']} sender, {counts['hups']['pull']} puller, {counts['hups']['relay']} relay; "
          f"daemons it stopped {len(hup_deaths)}; reloads logged: relay {reloads['relay']}, puller {reloads['pull']}, "
          f"sender {reloads['send']}")
    term_text = []
    for victim in ("send", "pull", "relay"):
        mine = [t for t in terms if t[0] == victim]
        good = [t for t in mine if t not in term_bad]
        term_text.append(f"{victim} {len(good)} of {len(mine)} exited 0 within {args.grace:g} s "
                         f"(slowest {max((t[2] for t in mine), default=0):.2f} s)")
    print(f"SIGTERM (the last of each at the end): {'; '.join(term_text)}; of which ended by the grace running "
          f"out: sender {ran_out['send']}, puller {ran_out['pull']}; daemons that ended by themselves "
          f"{len(unexpected)}")
    print(f"landing directories left {len(landing_left)}, file lists left in the landing zone {len(lists_left)}, "
          f"batches the core's catalogue still says are being checked {len(checking)}")
    if args.hostile:
        print(f"custody: {counts['relabelled']} batches relabelled into another site, {counts['replayed']} "
              f"replayed after delivery, {counts['dropped']} dropped whole, {counts['forged']} acknowledgements "
              f"forged ({len(withheld)} files withheld for good, their sources kept: "
              f"{len(withheld) - len(withheld_arrived)} of {len(withheld)} never arrived)")
        print(f"delivered under the wrong site {len(other_site)}, replays delivered again {len(replayed_again)}, "
              f"sources deleted but not delivered {len(deleted_unsent)}, receipts {len(receipt_lines)} "
              f"({'all verify' if receipts_ok else 'NOT ALL VERIFY'})")
    ok = not (missing or extra or corrupt or incomplete or left_at_relay or cancelled_arrived
              or catalogue_differs or stale or stuck or earlier_not_kept or kept_wrong or not receipts_ok or staging or landing_left or left_after_kill or tasks_left
              or tampered_promoted or not_quarantined or no_reason or tampered_lost or hup_deaths
              or term_bad or unexpected or checking)
    if args.hostile:
        ok = ok and not (other_site or replayed_again or deleted_unsent) and receipts_ok
    for name, items in (("missing", missing), ("extra", extra), ("corrupt", corrupt), ("stale", stale),
                        ("stuck at the relay", stuck), ("earlier version delivered, not kept", earlier_not_kept),
                        ("kept under .forte-replaced", kept_wrong),
                        ("acknowledged in the catalogues xor on disk", catalogue_differs),
                        ("task left after its puller", left_after_kill), ("task left at the end", tasks_left),
                        ("tampered file in the destination", tampered_promoted),
                        ("tampered batch not quarantined", not_quarantined),
                        ("quarantined without the change named", no_reason),
                        ("tampered file lost", tampered_lost), ("stopped by SIGHUP", hup_deaths),
                        ("SIGTERM not exited 0 within the grace", term_bad),
                        ("ended by itself", unexpected), ("landing directory left", landing_left),
                        ("still 'checking' in the core's catalogue", checking),
                        ("staging left", staging)):
        for item in items[:10]:
            print(f"  {name}: {item}")
    sys.exit(0 if ok else 1)


def kill_children():
    """Kills every process this soak started (the daemons, the relay): a soak that fails must
    not leave them running against its work directory."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():
            try:
                os.kill(int(stat.parent.name), signal.SIGKILL)
            except OSError:
                pass


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        kill_children()
        raise
