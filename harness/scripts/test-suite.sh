#!/usr/bin/env bash
# The whole test suite: install the dependencies, build everything, run every CTest test.
# GPU tests skip with a visible reason on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash harness/scripts/install-deps.sh
bash harness/scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
