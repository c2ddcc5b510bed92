#!/usr/bin/env bash
# The CUDA compiler launcher of every CUDA target (CMAKE_CUDA_COMPILER_LAUNCHER, set by the top-level
# CMakeLists.txt): runs the compile command it is given and fails it, removing its object, where
# ptxas reports that a kernel's warpgroup MMAs wait for each other: "wgmma.mma_async instructions
# are serialized ..." (advisories C7510 … C7520) or "warpgroup.wait is injected ..." (C7517, a wait
# for the MMAs inserted before an instruction that touches their registers). ptxas prints those as
# information, not as warnings, and such a kernel passes every test: only its time shows it (the
# GDN state pass serialised takes 1.75 ms instead of 1.29 at 64k tokens × 8 heads on an H200; small
# changes to the code between an MMA's commit and its wait can cause it). C7519, a warpgroup.arrive
# injected before an MMA, waits for nothing and passes.
set -uo pipefail
if (( $# == 0 )); then
  echo "usage: wgmma-serialization-guard.sh COMPILER ARGS... (a CMake compiler launcher)" >&2
  exit 2
fi
log=$(mktemp) || exit 1
"$@" 2>"$log"
status=$?
cat "$log" >&2
if (( status == 0 )) && grep -qE "wgmma.mma_async instructions are serialized|warpgroup.wait is injected" "$log"; then
  object=""
  args=("$@")
  for (( i = 0; i + 1 < ${#args[@]}; ++i )); do
    [[ ${args[i]} == -o ]] && object=${args[i + 1]}
  done
  [[ -n $object ]] && rm -f "$object"
  echo "error: ptxas serialised the warpgroup MMAs of a kernel compiled into ${object:-this object}" \
       "(its advisory above names the kernel and the cause); the build refuses MMAs that wait for each other" >&2
  status=1
fi
rm -f "$log"
exit "$status"
