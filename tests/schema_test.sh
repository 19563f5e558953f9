#!/usr/bin/env bash
# The committed FlatBuffers header of the artifact schema is what flatc makes of schema.fbs now (a stale
# one would read or write another layout than the schema says). Skips, saying so, without flatc.
set -euo pipefail
dir=$(cd "$(dirname "$0")/../include/ondine/artifact" && pwd)
if ! command -v flatc > /dev/null; then
  echo "schema_test: flatc not found (Debian: flatbuffers-compiler); skipped"
  exit 0
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flatc --cpp --scoped-enums --filename-suffix _generated --filename-ext hpp -o "$out" "$dir/schema.fbs"
if ! diff -u "$dir/detail/schema_generated.hpp" "$out/schema_generated.hpp" > "$out/diff"; then
  head -40 "$out/diff"
  echo "schema_test: include/ondine/artifact/detail/schema_generated.hpp is stale: regenerate it with"
  echo "  (cd include/ondine/artifact && flatc --cpp --scoped-enums --filename-suffix _generated --filename-ext hpp -o detail schema.fbs)"
  echo "0 passed, 1 failed"
  exit 1
fi
echo "1 passed, 0 failed"
