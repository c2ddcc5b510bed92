#!/usr/bin/env bash
# The whole test suite: install the dependencies, build everything, run every CTest test.
# GPU tests skip with a visible reason on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash harness/scripts/install-deps.sh
bash harness/scripts/build.sh
# The notebooks test may skip where its packages are absent, but not here: install-deps.sh installed them.
HYBRIDTB_REQUIRE_NOTEBOOKS=1 ctest --test-dir build --output-on-failure -j "$(nproc)"
