#!/usr/bin/env bash
# optimized/cmake/wgmma-serialization-guard.sh around stand-in compilers: a compile whose ptxas
# output reports serialised warpgroup MMAs or an injected wait for them fails (exit 1), its object
# removed and the advisory passed on; one reporting only an injected warpgroup.arrive (C7519) passes
# with its object; a failing compile keeps its own exit status; no command at all is a usage error
# (exit 2). Given a CUDA compiler (third argument, empty where there is none), also around it on the
# kernels of wgmma_guard/ for sm_90a (arrive_injected.cu plain and with a divergent accumulator
# write, serialised.cu): what this ptxas prints for them is what the guard reads.
set -uo pipefail
guard=$1
work=$2
nvcc=${3:-}
snippets=${4:-}
rm -rf "$work" && mkdir -p "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }

# A stand-in nvcc: writes the object named by -o, prints $ADVICE on stderr, exits $STATUS.
cat > "$work/fake-nvcc" <<'FAKE'
#!/usr/bin/env bash
args=("$@")
for (( i = 0; i + 1 < ${#args[@]}; ++i )); do
  [[ ${args[i]} == -o ]] && echo object > "${args[i + 1]}"
done
[[ -n ${ADVICE:-} ]] && echo "$ADVICE" >&2
exit "${STATUS:-0}"
FAKE
chmod +x "$work/fake-nvcc"
# The outcome of one guarded compile: expect_outcome LABEL STATUS EXPECTED_STATUS OBJECT STDERR_FILE.
# A passing compile (0) keeps its object, one the guard fails (1) has it removed; any other status is
# the compiler's own and leaves the object to it.
expect_outcome() {
  local label=$1 status=$2 expected=$3 object=$4 stderr_file=$5
  (( status == expected )) || fail "$label: exit $status, expected $expected: $(cat "$stderr_file")"
  if (( expected == 0 )); then
    [[ -s $object ]] || fail "$label: the object is missing"
  elif (( expected == 1 )); then
    [[ ! -e $object ]] || fail "$label: the object was kept"
  fi
}
# One guarded compile by the stand-in: guarded NAME EXPECTED_EXIT (ADVICE and STATUS from the caller's
# environment), its object NAME.o.
guarded() {
  bash "$guard" "$work/fake-nvcc" -c "$1.cu" -o "$work/$1.o" 2>"$work/$1.err"
  expect_outcome "$1" $? "$2" "$work/$1.o" "$work/$1.err"
  [[ -z ${ADVICE:-} ]] || grep -qF "$ADVICE" "$work/$1.err" || fail "$1: the compiler's message was not passed on"
}
advice="ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are serialized"
ADVICE="$advice due to program dependence on compiler-inserted WG.AR in divergent path in the function 'k'" \
  guarded serialised 1
grep -q "error: ptxas serialised the warpgroup MMAs of a kernel compiled into $work/serialised.o" \
  "$work/serialised.err" || fail "serialised: no error naming the object"
advice="ptxas info    : (C7517) warpgroup.wait is injected in around line 56 by compiler to allow use of registers"
ADVICE="$advice defined by GMMA in function 'k'" guarded wait_injected 1
advice="ptxas info    : (C7519) warpgroup.arrive is injected in around line 10 by compiler to allow use of registers"
ADVICE="$advice in GMMA in function 'k'" guarded arrive_injected 0
ADVICE="error: something" STATUS=3 guarded failing_compile 3

bash "$guard" 2>"$work/usage.err"
status=$?
(( status == 2 )) || fail "no command: exit $status, expected 2"
grep -q "usage:" "$work/usage.err" || fail "no command: no usage line"
if [[ -z $nvcc ]]; then
  echo "ok (stand-in compilers; the real-compiler cases need a CUDA compiler: none configured)"
  exit 0
fi
# One guarded compile by nvcc: compiled NAME SOURCE EXPECTED_EXIT ADVISORY [NVCC FLAGS…]
compiled() {
  local name=$1 source=$2 expected=$3 advisory=$4
  shift 4
  bash "$guard" "$nvcc" -gencode=arch=compute_90a,code=sm_90a "$@" -c "$snippets/$source" -o "$work/nvcc-$name.o" \
    2>"$work/nvcc-$name.err"
  expect_outcome "nvcc, $name" $? "$expected" "$work/nvcc-$name.o" "$work/nvcc-$name.err"
  grep -q "$advisory" "$work/nvcc-$name.err" || fail "nvcc, $name: no '$advisory' advisory (ptxas changed?)"
}
compiled arrive_injected arrive_injected.cu 0 "warpgroup.arrive is injected"
compiled serialised serialised.cu 1 "wgmma.mma_async instructions are serialized"
compiled wait_injected arrive_injected.cu 1 "warpgroup.wait is injected" -DWRITE_ACCUMULATOR_IN_DIVERGENT_PATH
echo "ok (stand-in compilers and $nvcc)"
