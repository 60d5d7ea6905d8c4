#!/usr/bin/env bash
# Install and start a local PostgreSQL server with a `hypic_test` database for the registry tests.
set -euo pipefail
if ! command -v pg_ctlcluster >/dev/null 2>&1 || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
ver=$(ls /usr/lib/postgresql | sort -n | tail -n 1)
pg_lsclusters | grep -q "^$ver *main" || pg_createcluster "$ver" main >/dev/null
pg_ctlcluster "$ver" main start 2>/dev/null || pg_ctlcluster "$ver" main status >/dev/null
for _ in $(seq 1 30); do su postgres -c "pg_isready -q" && break; sleep 1; done
su postgres -c "psql -tAc \"SELECT 1 FROM pg_roles WHERE rolname='hypic'\"" | grep -q 1 \
  || su postgres -c "psql -qc \"CREATE USER hypic WITH PASSWORD 'hypic';\""
su postgres -c "psql -tAc \"SELECT 1 FROM pg_database WHERE datname='hypic_test'\"" | grep -q 1 \
  || su postgres -c "createdb -O hypic hypic_test"
echo "postgres ready"
