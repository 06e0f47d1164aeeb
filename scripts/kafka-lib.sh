#!/usr/bin/env bash
# Assembles the Kafka broker jars (scripts/kafka/pom.xml) into a cached lib folder and prints its
# path. A stamp file, written last, marks the folder complete; with it present this is a no-op.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
lib="${OUTBOX_KAFKA_LIB:-$HOME/.cache/outbox-relay/kafka-4.4.0/lib}"
stamp="$lib/.complete"

# The broker's log4j2 config travels with the jars so Go code needs no repository path; it is
# refreshed on every run because it is cheap and may change without the jars changing.
if [[ -f "$stamp" ]]; then
  cmp -s "$here/kafka/log4j2.properties" "$lib/log4j2.properties" ||
    cp "$here/kafka/log4j2.properties" "$lib/log4j2.properties"
  echo "$lib"
  exit 0
fi

command -v mvn >/dev/null || { echo "kafka-lib: mvn not found (run scripts/ensure-tools.sh)" >&2; exit 1; }

# Build into a scratch folder beside the target and swap it in, so an interrupted run never
# leaves a half-filled lib folder that looks usable.
parent="$(dirname "$lib")"
mkdir -p "$parent"
work="$(mktemp -d "$parent/.kafka-lib.XXXXXX")"
trap 'rm -rf "$work"' EXIT

build() {
  rm -rf "$work/target" "$work/lib"
  mvn -B -q -Dstyle.color=never -f "$here/kafka/pom.xml" package \
    -Dkafka.build.dir="$work/target" -Dlib.dir="$work/lib" >"$work/mvn.log" 2>&1
}
if ! build; then
  echo "kafka-lib: maven failed, retrying once" >&2
  sleep 2
  if ! build; then
    tail -n 40 "$work/mvn.log" >&2
    echo "kafka-lib: maven failed twice (log above)" >&2
    exit 1
  fi
fi

# Exactly one slf4j binding, or the broker either logs nothing or warns about several.
bindings=$(find "$work/lib" -name 'log4j-slf4j*-impl-*.jar' -o -name 'slf4j-reload4j-*.jar' -o -name 'logback-classic-*.jar' | wc -l)
if [[ "$bindings" -ne 1 ]]; then
  echo "kafka-lib: expected exactly one slf4j binding in lib, found $bindings" >&2
  exit 1
fi
[[ -n "$(find "$work/lib" -name 'kafka_2.13-*.jar')" ]] || { echo "kafka-lib: kafka_2.13 jar missing" >&2; exit 1; }

cp "$here/kafka/log4j2.properties" "$work/lib/log4j2.properties"
rm -rf "$lib"
mv "$work/lib" "$lib"
date -u +%FT%TZ >"$stamp"
echo "$lib"
