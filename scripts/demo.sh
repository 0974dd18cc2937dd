#!/usr/bin/env bash
# The demo: builds softverbs and moves real data through it on localhost (the body is the
# installed softverbs-demo, cmake/templates/softverbs-demo.in, run on build/).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
bash scripts/install-deps.sh
bash scripts/build.sh build >/dev/null
SV_DEMO_LIBDIR=$ROOT/build/lib SV_DEMO_BINDIR=$ROOT/build/bin exec bash build/install/softverbs-demo
