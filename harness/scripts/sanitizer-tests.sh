#!/usr/bin/env bash
# The CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer ("Bad input,
# hardened"): configures build-asan (CPU only, RelWithDebInfo, -DHYBRIDTB_SANITIZE=address,undefined),
# builds the CLI, the tests and the fuzz target, runs every CPU CTest test (the broken-file corpus,
# `ctest -L broken`, and the fuzz smoke included), then a longer bounded fuzz run of the batch-file
# loader. Any sanitizer report fails the run: UBSan is fatal (-fno-sanitize-recover=all) and ASan
# aborts on its first error. Called by .ci/run after test-suite.sh; idempotent.
#
#   bash harness/scripts/sanitizer-tests.sh [--fuzz-seconds S]      (default 90)
#
# Excluded tests: none are excluded for speed; GPU tests are not built (HYBRIDTB_CUDA=OFF).
# Measured on a 2-core machine: build 9 min, tests 2.3 min, fuzz 1.5 min (13 min in all).
set -euo pipefail
cd "$(dirname "$0")/../.."
fuzz_seconds=90
if [[ "${1:-}" == "--fuzz-seconds" ]]; then fuzz_seconds="$2"; shift 2; fi
[[ $# -eq 0 ]] || { echo "usage: sanitizer-tests.sh [--fuzz-seconds S]" >&2; exit 2; }

bash harness/scripts/install-deps.sh
start=$SECONDS
# -O1 -g1: the optimisation ASan recommends (fast enough to run, quicker to compile than -O2) and
# line tables for symbolised reports; CI has two cores and the build dominates this script.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHYBRIDTB_CUDA=OFF \
  -DHYBRIDTB_SANITIZE=address,undefined \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
cmake --build build-asan -j "$(nproc)"
echo "sanitizer-tests: build took $((SECONDS - start)) s"

# detect_leaks: LeakSanitizer too. abort_on_error=0 keeps the exit status ASan's (1, or 23 for
# leaks), which the corpus check reports as "exit status 1, expected 2" with the report.
export ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
start=$SECONDS
ctest --test-dir build-asan --output-on-failure -j "$(nproc)" -L cpu
echo "sanitizer-tests: ctest took $((SECONDS - start)) s"

start=$SECONDS
build-asan/tests/fuzz/fuzz_batch_file --work build-asan/fuzz-ci --seconds "$fuzz_seconds" --seed "${HYBRIDTB_FUZZ_SEED:-20261122}" \
  datasets/examples datasets/recorded
echo "sanitizer-tests: fuzz took $((SECONDS - start)) s"
