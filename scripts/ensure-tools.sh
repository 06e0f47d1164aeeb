#!/usr/bin/env bash
# Checks the tools the local services need (PostgreSQL server + pg_recvlogical, Java 17+, Maven,
# PgBouncer for the leader-lock-through-a-pooler tests) and installs missing ones with apt-get when running as root. Fast and silent when all exist.
set -euo pipefail

missing=()

# Server binaries are not on PATH on Debian (pg_ctl may be a symlink into the real bin dir);
# internal/devenv looks in the same places.
pg_bin=""
candidates=()
command -v pg_ctl >/dev/null && candidates+=("$(dirname "$(readlink -f "$(command -v pg_ctl)")")")
candidates+=($(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV))
for d in "${candidates[@]}"; do
  if [[ -x "$d/initdb" && -x "$d/pg_ctl" && -x "$d/postgres" ]]; then pg_bin="$d"; break; fi
done
[[ -n "$pg_bin" ]] || missing+=(postgresql)

if ! command -v pg_recvlogical >/dev/null && [[ -z "$pg_bin" || ! -x "$pg_bin/pg_recvlogical" ]]; then
  missing+=(postgresql-client)
fi

java_major() {
  local v
  v="$(java -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n1)"
  [[ "$v" == 1.* ]] && v="${v#1.}"
  echo "${v%%[.+-]*}"
}
if ! command -v java >/dev/null || [[ "$(java_major)" -lt 17 ]]; then
  missing+=(openjdk-17-jre-headless)
fi

command -v mvn >/dev/null || missing+=(maven)
# scripts/pg-lib.sh unpacks the other PostgreSQL versions from jars holding .txz archives.
command -v unzip >/dev/null || missing+=(unzip)
command -v xz >/dev/null || missing+=(xz-utils)
# deploy/'s test runs Prometheus' own checks of the alert rules and their unit tests with promtool.
command -v promtool >/dev/null || missing+=(prometheus)
# internal/devenv runs PgBouncer (Debian installs it in /usr/sbin) for the leader lock's pooler tests.
command -v pgbouncer >/dev/null || [[ -x /usr/sbin/pgbouncer ]] || missing+=(pgbouncer)

if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

if [[ "$(id -u)" -ne 0 ]]; then
  echo "ensure-tools: missing: ${missing[*]}" >&2
  echo "ensure-tools: install them (Debian/Ubuntu: sudo apt-get install -y ${missing[*]}) and rerun" >&2
  exit 1
fi

echo "ensure-tools: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >&2
# A newer JDK may already be the default; only an older default needs switching.
if [[ " ${missing[*]} " == *" openjdk-17-jre-headless "* ]] && [[ "$(java_major)" -lt 17 ]]; then
  update-alternatives --set java "$(ls -d /usr/lib/jvm/java-17-openjdk-*/bin/java | head -n1)"
fi
echo "ensure-tools: done" >&2
