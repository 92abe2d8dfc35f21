"""A real forte site on loopback for the provider's tests, as the Rust integration tests run one
(crates/forte/tests/it/common/site.rs): keys from ``forte keygen``, a ``tokens.toml`` with an
edge and a core token, ``forte relay`` on a free port (it prints its URL and certificate
fingerprint), then ``forte send INBOX --watch --http ADDR`` and ``forte pull --watch --http
ADDR`` against it, each with its own SQLite catalogue. Every process is stopped by ``stop()``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
EDGE_TOKEN = "edge-site-a-0123456789abcdef"
CORE_TOKEN = "core-token-0123456789abcdef"
SITE = "site-a"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(why: str) -> None:
    """A prerequisite is missing: the test is skipped, except in CI (CI=true), where it fails."""
    if in_ci():
        pytest.fail(f"{why} (CI must run these tests)", pytrace=False)
    pytest.skip(why)


def forte_bin() -> str:
    """``FORTE_BIN``, else ``<repo>/target/debug/forte``; it must serve the JSON API (``--http``)."""
    path = os.environ.get("FORTE_BIN") or str(REPO / "target" / "debug" / "forte")
    if not os.access(path, os.X_OK):
        missing(f"no forte binary at {path}: build it (cargo build -p forte) or set FORTE_BIN")
    help_text = subprocess.run([path, "send", "--help"], capture_output=True, text=True).stdout
    if "--http" not in help_text:
        missing(f"{path} has no `send --http`: it does not serve the JSON API (docs/api.md) yet")
    return path


def free_addr(host: str = "127.0.0.1") -> str:
    """An address of ``host`` with a port free at the moment of asking."""
    with socket.socket() as s:
        s.bind((host, 0))
        return f"{host}:{s.getsockname()[1]}"


def get_json(url: str, timeout: float = 5.0, token: str | None = None) -> object:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
        return json.loads(r.read())


def outside_address() -> str:
    """This machine's address on its default route: a request to it, from here, comes from
    that address, not from loopback (forte then asks for its --http-token-file's token)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route
            address = s.getsockname()[0]
        except OSError:
            address = ""
    if not address or address.startswith("127."):
        missing("this machine has no address but loopback: the test of tokens needs one")
    return address


class Site:
    """A relay, a watching sender and a watching puller under ``root``.

    ``relay_flags``, ``send_flags``, ``pull_flags``: extra arguments (``--quota-per-site 1MiB``).
    ``interval``: the daemons' ``--interval`` (seconds between two scans).
    ``http_host``: where the daemons serve their API (a port is picked); ``http_token``: the
    token of their ``--http-token-file``, which requests from other hosts must send.
    ``more_sites``: further sites, each with its own edge token at the relay and its own
    ``forte send --watch`` (inbox ``root/inbox-SITE``, catalogue, API: ``inboxes[SITE]``,
    ``edge_addrs[SITE]``); every site signs with the same edge key, which the core trusts bound
    to each site (``--trust SITE=edge.pub``).
    """

    def __init__(
        self,
        root: Path,
        relay_flags: tuple[str, ...] = (),
        send_flags: tuple[str, ...] = (),
        pull_flags: tuple[str, ...] = (),
        interval: int = 1,
        http_host: str = "127.0.0.1",
        http_token: str | None = None,
        more_sites: tuple[str, ...] = (),
    ) -> None:
        self.bin = forte_bin()
        self.root = root
        self.http_host = http_host
        self.http_token = http_token
        self.inbox = root / "inbox"
        self.dest = root / "dest"
        self.inbox.mkdir(parents=True)
        self.dest.mkdir(parents=True)
        self.procs: list[subprocess.Popen] = []
        self.logs: dict[str, Path] = {}
        self.more_sites = more_sites
        self.inboxes: dict[str, Path] = {SITE: self.inbox}
        self.edge_addrs: dict[str, str] = {}
        try:
            self._start(relay_flags, send_flags, pull_flags, interval)
        except BaseException:
            self.stop()
            raise

    def forte(self, *args: str) -> str:
        done = subprocess.run([self.bin, *args], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"forte {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
        return done.stdout

    def _spawn(self, name: str, args: list[str], stdout=None) -> subprocess.Popen:
        log = self.root / f"{name}.log"
        self.logs[name] = log
        proc = subprocess.Popen(
            [self.bin, *args],
            stdout=stdout if stdout is not None else open(log, "ab"),
            stderr=open(log, "ab"),
            stdin=subprocess.DEVNULL,
            cwd=self.root,
        )
        self.procs.append(proc)
        return proc

    def _start(self, relay_flags, send_flags, pull_flags, interval) -> None:
        keys = self.root / "keys"
        self.forte("keygen", "--dir", str(keys))
        tokens = self.root / "tokens.toml"
        tokens.write_text(
            f'[[token]]\ntoken = "{EDGE_TOKEN}"\nrole = "edge"\nsite = "{SITE}"\n'
            + "".join(f'[[token]]\ntoken = "{edge_token(s)}"\nrole = "edge"\nsite = "{s}"\n' for s in self.more_sites)
            + f'[[token]]\ntoken = "{CORE_TOKEN}"\nrole = "core"\nsites = ["*"]\n'
        )
        (self.root / "edge.token").write_text(EDGE_TOKEN)
        (self.root / "core.token").write_text(CORE_TOKEN)
        relay = self._spawn(
            "relay",
            ["relay", "--listen", "127.0.0.1:0", "--store", str(self.root / "relay"), "--tokens", str(tokens), *relay_flags],
            stdout=subprocess.PIPE,
        )
        self.relay_url, self.fingerprint = self._relay_address(relay)
        relay_args = ["--relay", self.relay_url, "--relay-fingerprint", self.fingerprint]
        self.edge_addr, self.core_addr = free_addr(self.http_host), free_addr(self.http_host)
        watch = ["--watch", "--interval", str(interval)]
        http = []
        if self.http_token:
            (self.root / "http.token").write_text(self.http_token)
            http = ["--http-token-file", str(self.root / "http.token")]
        self._spawn(
            "send",
            ["--catalog", str(self.root / "edge.sqlite"), "send", str(self.inbox), *watch, "--http", self.edge_addr, *http,
             "--recipient", str(keys / "core.pub"), "--sign", str(keys / "edge.key"), "--site", SITE,
             *relay_args, "--token-file", str(self.root / "edge.token"), *send_flags],
        )
        self._spawn(
            "pull",
            ["--catalog", str(self.root / "core.sqlite"), "pull", "--to", str(self.dest), *watch, "--http", self.core_addr, *http,
             "--identity", str(keys / "core.key"),
             *(a for site in (SITE, *self.more_sites) for a in ("--trust", f"{site}={keys / 'edge.pub'}")),
             *relay_args, "--token-file", str(self.root / "core.token"), *pull_flags],
        )
        self.edge_addrs[SITE] = self.edge_addr
        for other in self.more_sites:
            inbox = self.root / f"inbox-{other}"
            inbox.mkdir()
            self.inboxes[other] = inbox
            (self.root / f"edge-{other}.token").write_text(edge_token(other))
            addr = self.edge_addrs[other] = free_addr(self.http_host)
            self._spawn(
                f"send-{other}",
                ["--catalog", str(self.root / f"edge-{other}.sqlite"), "send", str(inbox), *watch, "--http", addr, *http,
                 "--recipient", str(keys / "core.pub"), "--sign", str(keys / "edge.key"), "--site", other,
                 *relay_args, "--token-file", str(self.root / f"edge-{other}.token"), *send_flags],
            )
        for addr in (*self.edge_addrs.values(), self.core_addr):
            self._wait_for_api(addr)

    def _relay_address(self, relay: subprocess.Popen) -> tuple[str, str]:
        """The relay's URL and fingerprint from its first lines; its output is then drained
        into its log so that it never blocks on a full pipe."""
        assert relay.stdout is not None
        url = fingerprint = ""
        seen = []
        deadline = time.monotonic() + 30
        while not (url and fingerprint):
            line = relay.stdout.readline().decode(errors="replace")
            if not line:
                raise RuntimeError(f"forte relay stopped before saying where it listens:\n{''.join(seen)}{self.log('relay')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"forte relay said no address in 30 s:\n{''.join(seen)}")
            seen.append(line)
            line = line.strip()
            if line.startswith("relay listening on "):
                url = line[len("relay listening on "):]
            if "sha256 fingerprint " in line:
                fingerprint = line.split("sha256 fingerprint ", 1)[1].rstrip(")")
        out, log = relay.stdout, self.logs["relay"]

        def drain() -> None:
            with open(log, "ab") as f:
                f.write("".join(seen).encode())
                for chunk in iter(lambda: out.readline(), b""):
                    f.write(chunk)
                    f.flush()

        threading.Thread(target=drain, daemon=True).start()
        return url, fingerprint

    def _wait_for_api(self, addr: str, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while True:
            try:
                get_json(f"http://{addr}/api/v1", timeout=2, token=self.http_token)
                return
            except (OSError, ValueError) as e:
                dead = [p.args[1:3] for p in self.procs if p.poll() is not None]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"no API at http://{addr}/api/v1 ({e}); stopped: {dead}\n{self.all_logs()}") from e
                time.sleep(0.1)

    def conn_env(self, addr: str, token: str | None = None) -> str:
        """An Airflow connection (``AIRFLOW_CONN_…``, JSON) of type forte to ``addr``."""
        host, port = addr.rsplit(":", 1)
        conn = {"conn_type": "forte", "host": host, "port": int(port), "schema": "http"}
        if token:
            conn["password"] = token
        return json.dumps(conn)

    def log(self, name: str) -> str:
        path = self.logs.get(name)
        return path.read_text(errors="replace") if path and path.exists() else ""

    def all_logs(self) -> str:
        return "".join(f"\n--- forte {name} ---\n{self.log(name)[-6000:]}" for name in self.logs)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def edge_token(site: str) -> str:
    return f"edge-{site}-0123456789abcdef"


def place(inbox: Path, name: str, files: dict[str, bytes]) -> Path:
    """Puts a batch into an inbox as an instrument would: written in a hidden directory (the
    watcher skips those), marked ready, and renamed into place in one step."""
    tmp = inbox / f".{name}.tmp"
    write_batch(tmp, files)
    (tmp / ".ready").write_bytes(b"")
    os.rename(tmp, inbox / name)
    return inbox / name


def tree(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` by its relative path, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def write_batch(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def incompressible(length: int, seed: int) -> bytes:
    """Bytes no codec can shrink, so that a test controls what the relay must hold."""
    import hashlib

    out = bytearray()
    i = 0
    while len(out) < length:
        out += hashlib.sha256(f"{seed}:{i}".encode()).digest()
        i += 1
    return bytes(out[:length])


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, symlinks=True)
