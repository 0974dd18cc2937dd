#!/usr/bin/env bash
# scripts/build.sh [build-dir] [extra cmake args...]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$ROOT/build}
shift || true
cmake -S "$ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSV_WERROR=ON "$@" >/dev/null
ninja -C "$B"
