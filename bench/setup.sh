#!/usr/bin/env bash
# Installs what the benchmarks in bench/ and docs/benchmarks.md need, on a fresh machine of
# the project's kind, after the README's first command (which builds forte):
#   Debian: rsync, rclone, gpg, zstd, age, iproute2 (tc, ip netns), linux-perf
#   Go module proxy: Toxiproxy's server (20 ms of added latency for bench/wan.py)
#   PyPI, in target/bench-python: pyarrow, numpy, DuckDB (forte-bench ingest's baseline a) and
#   ObsPy (bench/obspy_recording.py)
# Run as root (or through sudo). Then, for example: bench/wan.py --level 1 (as root); bench/prepare.py --runs 3;
#   target/release/forte-bench ingest --python target/bench-python/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq rsync rclone gpg zstd age iproute2 linux-perf
if ! command -v toxiproxy-server >/dev/null && [ ! -x "$HOME/go/bin/server" ]; then
    go install github.com/Shopify/toxiproxy/v2/cmd/server@v2.12.0
fi
python3 -m venv target/bench-python
target/bench-python/bin/pip install -q --disable-pip-version-check pyarrow numpy duckdb obspy
echo "ready: Toxiproxy in ~/go/bin/server, Python with pyarrow/ObsPy in target/bench-python"
