#!/usr/bin/env bash
# Assembles Kafka Connect 4.3, Debezium 3.6.1.Final and Apicurio Registry's Avro converter
# (bench/debezium/pom.xml) into a cached lib folder for the benchmark and make test-debezium, and
# prints its path. A stamp file, written last, marks the folder complete and holds the pom's
# checksum: with it present and the pom unchanged this is a no-op; a changed pom (a jar added)
# assembles the folder again.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
lib="${OUTBOX_DEBEZIUM_LIB:-$HOME/.cache/outbox-relay/debezium-3.6.1/lib}"
stamp="$lib/.complete"

pomsum="$(sha256sum "$here/debezium/pom.xml" | cut -d' ' -f1)"
if [[ -f "$stamp" ]] && grep -qx "pom $pomsum" "$stamp"; then
  cmp -s "$here/debezium/log4j2.properties" "$lib/log4j2.properties" ||
    cp "$here/debezium/log4j2.properties" "$lib/log4j2.properties"
  echo "$lib"
  exit 0
fi

command -v mvn >/dev/null || { echo "debezium-lib: mvn not found (run scripts/ensure-tools.sh)" >&2; exit 1; }

# Build into a scratch folder beside the target and swap it in, so an interrupted run never
# leaves a half-filled lib folder that looks usable.
parent="$(dirname "$lib")"
mkdir -p "$parent"
work="$(mktemp -d "$parent/.debezium-lib.XXXXXX")"
trap 'rm -rf "$work"' EXIT

build() {
  rm -rf "$work/target" "$work/lib"
  mvn -B -q -Dstyle.color=never -f "$here/debezium/pom.xml" package \
    -Dlib.build.dir="$work/target" -Dlib.dir="$work/lib" >"$work/mvn.log" 2>&1
}
if ! build; then
  echo "debezium-lib: maven failed, retrying once" >&2
  sleep 2
  if ! build; then
    tail -n 40 "$work/mvn.log" >&2
    echo "debezium-lib: maven failed twice (log above)" >&2
    exit 1
  fi
fi

# Exactly one slf4j binding, or Connect either logs nothing or warns about several.
bindings=$(find "$work/lib" -name 'log4j-slf4j*-impl-*.jar' -o -name 'slf4j-reload4j-*.jar' -o -name 'logback-classic-*.jar' | wc -l)
if [[ "$bindings" -ne 1 ]]; then
  echo "debezium-lib: expected exactly one slf4j binding in lib, found $bindings" >&2
  exit 1
fi
for jar in connect-runtime-4.3 debezium-connector-postgres-3.6.1.Final debezium-connect-plugins-3.6.1.Final apicurio-registry-utils-converter-2.6.13.Final; do
  [[ -n "$(find "$work/lib" -name "$jar*.jar")" ]] || { echo "debezium-lib: $jar jar missing" >&2; exit 1; }
done

cp "$here/debezium/log4j2.properties" "$work/lib/log4j2.properties"
rm -rf "$lib"
mv "$work/lib" "$lib"
printf '%s\npom %s\n' "$(date -u +%FT%TZ)" "$pomsum" >"$stamp"
echo "$lib"
