#!/usr/bin/env bash
# Configures and builds hybridtb into ./build (Release, Ninja). The CUDA backend is built when nvcc
# is found (HYBRIDTB_CUDA=AUTO); pass e.g. HYBRIDTB_CUDA=OFF in the environment to skip it.
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DHYBRIDTB_CUDA="${HYBRIDTB_CUDA:-AUTO}"
cmake --build build -j "$(nproc)"
