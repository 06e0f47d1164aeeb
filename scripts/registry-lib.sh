#!/usr/bin/env bash
# Unpacks the schema registry the tests run against, Apicurio Registry 2.6.13.Final from Maven
# Central (scripts/registry/pom.xml: Java 17, in-memory storage, the Confluent-compatible API at
# /apis/ccompat/v7), into a cached folder and prints its path. A stamp file, written last, marks
# the folder complete; with it present this is a no-op. internal/devenv runs the runner jar there
# (devenv.DefaultRegistryLib, devenv.StartRegistry).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version=2.6.13.Final
lib="${OUTBOX_REGISTRY_LIB:-$HOME/.cache/outbox-relay/apicurio-registry-$version}"
stamp="$lib/.complete"
runner="apicurio-registry-app-$version-runner.jar"

if [[ -f "$stamp" ]]; then
  echo "$lib"
  exit 0
fi
command -v mvn >/dev/null || { echo "registry-lib: mvn not found (run scripts/ensure-tools.sh)" >&2; exit 1; }
command -v unzip >/dev/null || { echo "registry-lib: unzip not found (run scripts/ensure-tools.sh)" >&2; exit 1; }

# Unpack into a scratch folder beside the target and swap it in, so an interrupted run never
# leaves a half-filled folder that looks usable.
parent="$(dirname "$lib")"
mkdir -p "$parent"
work="$(mktemp -d "$parent/.registry-lib.XXXXXX")"
trap 'rm -rf "$work"' EXIT

fetch() {
  rm -rf "$work/zip"
  mvn -B -q -Dstyle.color=never -f "$here/registry/pom.xml" package -Dout.dir="$work/zip" >"$work/mvn.log" 2>&1
}
if ! fetch; then
  echo "registry-lib: maven failed, retrying once" >&2
  sleep 2
  if ! fetch; then
    tail -n 40 "$work/mvn.log" >&2
    echo "registry-lib: maven failed twice (log above)" >&2
    exit 1
  fi
fi

# The zip holds the runner jar beside lib/, which the jar's manifest names on its class path:
# keep them together.
unzip -q -o "$work/zip/apicurio-registry-app-$version-all.zip" -d "$work/lib"
[[ -f "$work/lib/$runner" && -d "$work/lib/lib" ]] || { echo "registry-lib: $runner or lib/ missing from the zip" >&2; exit 1; }

rm -rf "$lib"
mv "$work/lib" "$lib"
date -u +%FT%TZ >"$stamp"
echo "$lib"
