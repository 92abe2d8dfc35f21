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
# relay, senders and a puller on loopback, run by the forte binary cargo test has just built, on
# the Airflow pinned today (requirements.txt, 3.1) and on the previous minor version
# (requirements-3.0.txt). Airflow pins many packages of its own, so each gets a virtualenv of its
# own, installed from PyPI with the pins of its file; the copy kept beside it says which pins it
# has, so that changed pins install again.
#
# The provider as it ships: a wheel built from integrations/airflow (pip wheel, setuptools from
# PyPI in an isolated build), installed with pip into each virtualenv (its dependencies being
# those pins), every time, so the tests run the wheel of this tree. The wheel must hold every
# subpackage, and the tests must import the installed copy, not the source tree.
airflow_tests() {
    local venv=$1 requirements=$2
    if ! cmp -s "$requirements" "$venv/requirements.txt" ||
        ! "$venv/bin/python" -c 'import airflow, pytest' 2>/dev/null; then
        echo "installing apache-airflow ($requirements) into $venv" >&2
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements"
        cp "$requirements" "$venv/requirements.txt"
    fi
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$airflow_wheel"
    # (Its stdout, Airflow's log lines on import, is dropped; a failed check says why on stderr.)
    "$venv/bin/python" - >/dev/null <<'PY'
import importlib.metadata, json, airflow_provider_forte, sysconfig
where = airflow_provider_forte.__file__
assert where.startswith(sysconfig.get_paths()["purelib"]), f"the provider is imported from {where}, not the installed wheel"
url = json.loads(importlib.metadata.distribution("airflow-provider-forte").read_text("direct_url.json") or "{}")
assert url.get("url", "").endswith(".whl"), f"airflow-provider-forte was not installed from a wheel: {url}"
PY
    echo "the Airflow provider's tests on apache-airflow $("$venv/bin/python" -c 'import airflow; print(airflow.__version__)' 2>/dev/null) ($venv)" >&2
    # -p no:cacheprovider: no .pytest_cache in the source tree.
    FORTE_BIN="$PWD/target/debug/forte" "$venv/bin/python" -m pytest -q -p no:cacheprovider integrations/airflow/tests
}
python3 -m venv target/airflow-build
airflow_wheels=target/airflow-wheel
rm -rf "$airflow_wheels"
target/airflow-build/bin/pip wheel -q --disable-pip-version-check --no-deps -w "$airflow_wheels" integrations/airflow
rm -rf integrations/airflow/build integrations/airflow/*.egg-info
airflow_wheel=$(ls "$airflow_wheels"/airflow_provider_forte-*.whl)
python3 - "$airflow_wheel" <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
for module in ("__init__", "assets", "batches", "hooks/forte", "operators/forte", "sensors/forte", "triggers/forte"):
    path = f"airflow_provider_forte/{module}.py"
    assert path in names, f"{sys.argv[1]} lacks {path}"
for package in ("hooks", "operators", "sensors", "triggers"):
    assert f"airflow_provider_forte/{package}/__init__.py" in names, f"{sys.argv[1]} lacks the package {package}"
PY
airflow_tests target/airflow-venv integrations/airflow/requirements.txt
airflow_tests target/airflow-venv-3.0 integrations/airflow/requirements-3.0.txt
