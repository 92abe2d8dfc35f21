#!/usr/bin/env bash
# Starts a PostgreSQL server for the catalogue tests and prints the URL to export as
# FORTE_TEST_POSTGRES. Uses Debian's packaged cluster tools; run as root (or with sudo).
# Usage: export FORTE_TEST_POSTGRES="$(.ci/postgres.sh)"
set -euo pipefail
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
as_postgres() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi
}
if ! command -v pg_lsclusters >/dev/null; then
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >&2
fi
read -r version cluster _ < <(pg_lsclusters --no-header | head -1)
$sudo pg_ctlcluster "$version" "$cluster" start >&2 2>/dev/null || true
for _ in $(seq 1 30); do
    as_postgres psql -qAtc 'select 1' >/dev/null 2>&1 && break
    sleep 1
done
as_postgres psql -qAt >&2 <<'SQL'
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'forte') THEN
    CREATE ROLE forte LOGIN PASSWORD 'forte-test' CREATEDB;
  END IF;
END $$;
SQL
as_postgres psql -qAtc "SELECT 1 FROM pg_database WHERE datname = 'forte_test'" | grep -q 1 \
    || as_postgres createdb -O forte forte_test >&2
echo "postgres://forte:forte-test@127.0.0.1:5432/forte_test"
