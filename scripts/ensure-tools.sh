#!/usr/bin/env bash
# Checks the tools the local services need (PostgreSQL server + pg_recvlogical, Java 17+, Maven)
# and installs missing ones with apt-get when running as root. Fast and silent when all exist.
#   ensure-tools.sh          what make up and make demo run: PostgreSQL and Kafka
#   ensure-tools.sh test     and the test tools: promtool (deploy/'s alert rule checks) and PgBouncer
#                            (the leader lock through a pooler); make test runs this
#   ensure-tools.sh --list   print the Debian packages the mode needs, one a line, present or not,
#                            and install nothing (internal/devenv's test of what make demo installs)
set -euo pipefail

mode=services
list=false
for arg in "$@"; do
  case "$arg" in
    test) mode=test ;;
    --list) list=true ;;
    *) echo "ensure-tools: unknown argument $arg (want test and/or --list)" >&2; exit 2 ;;
  esac
done

missing=()
wanted=()
# need PACKAGE PRESENT: the mode needs PACKAGE; PRESENT (yes/no) says whether its tool is there.
need() {
  wanted+=("$1")
  [[ "$2" == yes ]] || missing+=("$1")
}
yes_if() { if "$@" >/dev/null 2>&1; then echo yes; else echo no; fi; }

# Server binaries are not on PATH on Debian (pg_ctl may be a symlink into the real bin dir);
# internal/devenv looks in the same places.
pg_bin=""
candidates=()
command -v pg_ctl >/dev/null && candidates+=("$(dirname "$(readlink -f "$(command -v pg_ctl)")")")
candidates+=($(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV))
for d in "${candidates[@]}"; do
  if [[ -x "$d/initdb" && -x "$d/pg_ctl" && -x "$d/postgres" ]]; then pg_bin="$d"; break; fi
done
need postgresql "$(yes_if test -n "$pg_bin")"

recvlogical=yes
if ! command -v pg_recvlogical >/dev/null && [[ -z "$pg_bin" || ! -x "$pg_bin/pg_recvlogical" ]]; then
  recvlogical=no
fi
need postgresql-client "$recvlogical"

java_major() {
  local v
  v="$(java -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n1)"
  [[ "$v" == 1.* ]] && v="${v#1.}"
  echo "${v%%[.+-]*}"
}
java=yes
if ! command -v java >/dev/null || [[ "$(java_major)" -lt 17 ]]; then
  java=no
fi
need openjdk-17-jre-headless "$java"

need maven "$(yes_if command -v mvn)"
# scripts/pg-lib.sh unpacks the other PostgreSQL versions from jars holding .txz archives.
need unzip "$(yes_if command -v unzip)"
need xz-utils "$(yes_if command -v xz)"
if [[ "$mode" == test ]]; then
  # deploy/'s test runs Prometheus' own checks of the alert rules and their unit tests with promtool.
  need prometheus "$(yes_if command -v promtool)"
  # internal/devenv runs PgBouncer (Debian installs it in /usr/sbin) for the leader lock's pooler tests.
  pgbouncer=no
  if command -v pgbouncer >/dev/null || [[ -x /usr/sbin/pgbouncer ]]; then pgbouncer=yes; fi
  need pgbouncer "$pgbouncer"
fi

if $list; then
  printf '%s\n' "${wanted[@]}"
  exit 0
fi

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
