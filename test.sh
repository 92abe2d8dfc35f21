#!/usr/bin/env bash
# Runs every test of the workspace on a fresh machine: first installs what the tests need and
# is missing, then `cargo test --workspace` (extra arguments are passed to it).
#
# The tests use the real tools to prove our files are standard: age, zstd and openssl from
# Debian (and rclone, whose filters `send --include …` must agree with); the report's PNG charts need a TrueType font (DejaVu); Parquet files from `forte
# ingest` are read back by pyarrow and DuckDB from PyPI, in a virtualenv inside the clone
# (Debian packages neither); the dashboard is driven in Debian's headless Chromium by selenium
# (chromedriver from Debian, selenium from PyPI in that virtualenv); the catalogue tests run
# against a real PostgreSQL server, which .ci/postgres.sh installs and starts; the S3 tests
# against a real S3 server, versitygw (it serves a directory as S3), built from the Go module
# proxy into target/go. Installing needs root (or sudo) the first time only.
set -euo pipefail
cd "$(dirname "$0")"

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
need=()
for tool in age zstd openssl mkfifo rclone; do
    command -v "$tool" >/dev/null || need+=("$tool")
done
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || need+=(chromium chromium-driver)
command -v python3 >/dev/null && python3 -c "import ensurepip" 2>/dev/null || need+=(python3-venv)
if [ "${#need[@]}" -gt 0 ]; then
    echo "installing ${need[*]} from Debian" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
        age zstd openssl coreutils rclone fonts-dejavu-core python3-venv chromium chromium-driver
fi

venv=target/test-python
if ! "$venv/bin/python" -c 'import pyarrow, duckdb, numpy, selenium' 2>/dev/null; then
    echo "installing pyarrow, duckdb, numpy and selenium into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check pyarrow duckdb numpy selenium
fi
FORTE_TEST_PYTHON="$PWD/$venv/bin/python"
export FORTE_TEST_PYTHON

FORTE_TEST_POSTGRES="${FORTE_TEST_POSTGRES:-$(.ci/postgres.sh)}"
export FORTE_TEST_POSTGRES

FORTE_TEST_VERSITYGW="${FORTE_TEST_VERSITYGW:-$PWD/target/go/bin/versitygw}"
if [ ! -x "$FORTE_TEST_VERSITYGW" ]; then
    echo "building versitygw v1.8.0 into target/go (Go module proxy)" >&2
    GOPATH="$PWD/target/go" GOFLAGS=-modcacherw go install github.com/versity/versitygw/cmd/versitygw@v1.8.0
fi
export FORTE_TEST_VERSITYGW

cargo test --workspace "$@"
# The relay's suite once more, its store a bucket of a real S3 server (the same tests, see
# crates/forte-relay/tests/relay.rs), with the workspace's features so that nothing is built again.
FORTE_TEST_RELAY_STORE=s3 cargo test --workspace --test relay "$@"

# The Airflow provider (integrations/airflow): its example DAGs under `dag.test()` against a real
# relay, sender and puller on loopback, run by the forte binary cargo test has just built.
# Airflow pins many packages of its own, so it gets a virtualenv of its own, installed from PyPI
# with the pins of requirements.txt; the copy kept beside it says which pins it has, so that
# changed pins install again.
airflow_venv=target/airflow-venv
if ! cmp -s integrations/airflow/requirements.txt "$airflow_venv/requirements.txt" ||
    ! "$airflow_venv/bin/python" -c 'import airflow, pytest, airflow_provider_forte' 2>/dev/null; then
    echo "installing apache-airflow (integrations/airflow/requirements.txt) into $airflow_venv" >&2
    python3 -m venv "$airflow_venv"
    "$airflow_venv/bin/pip" install -q --disable-pip-version-check -r integrations/airflow/requirements.txt
    # The provider itself, editable, its dependencies being those pins.
    "$airflow_venv/bin/pip" install -q --disable-pip-version-check --no-deps -e integrations/airflow
    cp integrations/airflow/requirements.txt "$airflow_venv/requirements.txt"
fi
# -p no:cacheprovider: no .pytest_cache in the source tree.
FORTE_BIN="$PWD/target/debug/forte" "$airflow_venv/bin/python" -m pytest -q -p no:cacheprovider integrations/airflow/tests
