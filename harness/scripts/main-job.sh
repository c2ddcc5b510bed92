#!/usr/bin/env bash
# The main job: install the dependencies, build, and compute the reference outputs of every
# example batch shipped in datasets/examples/, printing a summary of each (outputs go to
# build/main-job/).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash harness/scripts/install-deps.sh
bash harness/scripts/build.sh
mkdir -p build/main-job
for batch in datasets/examples/*.h5; do
  ./build/harness/cli/hybridtb run --backend reference --batch "$batch" --out "build/main-job/$(basename "$batch")"
  echo
done
