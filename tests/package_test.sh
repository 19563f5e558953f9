#!/usr/bin/env bash
# Installs the built package into a scratch prefix and builds + runs examples/host against it with
# find_package(ondine CONFIG REQUIRED): proves the package config a user relies on.
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src/examples/host" -B "$work/host" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/host" >/dev/null
"$work/host/ondine_host"
