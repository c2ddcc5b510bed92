#!/usr/bin/env bash
# The CUDA compiler launcher of every CUDA target (CMAKE_CUDA_COMPILER_LAUNCHER, set by the top-level
# CMakeLists.txt): runs the compile command it is given and fails it, removing its object, when
# ptxas reports that it serialised a kernel's warpgroup MMAs ("wgmma.mma_async instructions are
# serialized ...", advisories C7510 … C7520). ptxas prints those as information, not as warnings,
# and a kernel whose MMAs wait for each other passes every test: only its time shows it (the GDN
# state pass serialised takes 1.75 ms instead of 1.29 at 64k tokens × 8 heads on an H200; small
# changes to the code between an MMA's commit and its wait can cause it). C7519, a warpgroup.arrive
# injected before an MMA, is not a serialisation and passes.
set -uo pipefail
if (( $# == 0 )); then
  echo "usage: wgmma-serialization-guard.sh COMPILER ARGS... (a CMake compiler launcher)" >&2
  exit 2
fi
log=$(mktemp) || exit 1
"$@" 2>"$log"
status=$?
cat "$log" >&2
if (( status == 0 )) && grep -q "wgmma.mma_async instructions are serialized" "$log"; then
  object=""
  args=("$@")
  for (( i = 0; i + 1 < ${#args[@]}; ++i )); do
    [[ ${args[i]} == -o ]] && object=${args[i + 1]}
  done
  [[ -n $object ]] && rm -f "$object"
  echo "error: ptxas serialised the warpgroup MMAs of a kernel compiled into ${object:-this object}" \
       "(its advisory above names the kernel and the cause); the build refuses serialised wgmma" >&2
  status=1
fi
rm -f "$log"
exit "$status"
