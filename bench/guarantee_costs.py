#!/usr/bin/env python3
"""What the work forte's guarantees need, and rsync -z does not do, costs in CPU-seconds per GB
of raw data, measured with the real tools on the same data (issue 45: the data-centre side's
CPU against rsync's receiver).

Each step runs once over the whole data as one stream (SHA-256 by OpenSSL, which uses the
CPU's SHA extensions as forte's sha2 does; coreutils' sha256sum does not), its user + system time read from
the child's rusage: SHA-256 of the raw bytes (the edge hashes every file, the core hashes it
again after decompressing: the end-to-end check), zstd -3 and its decompression (both sides
of rsync -z do these too), age encryption and decryption of the compressed stream (the relay
cannot read), SHA-256 of that ciphertext (the edge, the relay and the core each hash every
part they hold), and TLS (AES-128-GCM over the compressed bytes: edge → relay, relay → core;
measured as AES-128-CTR, its cipher without the GHASH).

Usage: bench/guarantee_costs.py DIR   (e.g. /tmp/forte-bench/wan/inbox after bench/wan.py)
"""

import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path


def cpu_of(cmd, stdin_path, stdout_path=os.devnull) -> float:
    """CPU-seconds (user + system) of `cmd` reading `stdin_path`, writing `stdout_path`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(stdin_path, "rb") as i, open(stdout_path, "wb") as o:
        subprocess.run(cmd, stdin=i, stdout=o, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    root = Path(sys.argv[1])
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != ".ready")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        tmp = Path(tmp)
        raw, packed, sealed = tmp / "raw", tmp / "raw.zst", tmp / "raw.zst.age"
        with open(raw, "wb") as out:
            for f in files:
                out.write(f.read_bytes())
        gb = raw.stat().st_size / 1e9
        subprocess.run(["age-keygen", "-o", tmp / "key"], check=True, capture_output=True)
        recipient = subprocess.run(["age-keygen", "-y", tmp / "key"], check=True, capture_output=True,
                                   text=True).stdout.strip()
        steps = [
            ("SHA-256 of the raw data", ["openssl", "dgst", "-sha256"], raw, os.devnull),
            ("zstd -3 (rsync -z's sender too)", ["zstd", "-3", "-q", "-c", "-T1"], raw, packed),
            ("zstd -d (rsync -z's receiver too)", ["zstd", "-d", "-q", "-c"], packed, os.devnull),
            ("age encryption of the compressed data", ["age", "-r", recipient], packed, sealed),
            ("age decryption", ["age", "-d", "-i", str(tmp / "key")], sealed, os.devnull),
            ("SHA-256 of the ciphertext", ["openssl", "dgst", "-sha256"], sealed, os.devnull),
            ("AES-128-CTR of the compressed data (TLS's cipher without GHASH; one hop's side)",
             ["openssl", "enc", "-aes-128-ctr", "-K", "00" * 16, "-iv", "00" * 16], packed, os.devnull),
        ]
        print(f"{len(files)} files, {gb:.2f} GB raw, one pass each; CPU-seconds per GB of raw data\n")
        print("| step | CPU-s per GB raw |\n|---|---:|")
        for name, cmd, src, dst in steps:
            print(f"| {name} | {cpu_of(cmd, src, dst) / gb:.2f} |", flush=True)
        ratio = raw.stat().st_size / packed.stat().st_size
        print(f"\ncompression ratio {ratio:.2f} (zstd -3 of the whole stream)")


if __name__ == "__main__":
    main()
