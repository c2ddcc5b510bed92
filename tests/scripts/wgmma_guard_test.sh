#!/usr/bin/env bash
# optimized/cmake/wgmma-serialization-guard.sh around stand-in compilers: a compile whose ptxas
# output reports serialised warpgroup MMAs or an injected wait for them fails (exit 1), its object
# removed and the advisory passed on; one reporting only an injected warpgroup.arrive (C7519) passes
# with its object; a failing compile keeps its own exit status; no command at all is a usage error
# (exit 2). Given a CUDA compiler (third argument, empty where there is none), also around it on the
# kernels of wgmma_guard/ for sm_90a: what this ptxas prints for them is what the guard reads.
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
serialized="ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are serialized"
serialized+=" due to program dependence on compiler-inserted WG.AR in divergent path in the function 'k'"
injected="ptxas info    : (C7519) warpgroup.arrive is injected in around line 10 by compiler to allow use of registers"
injected+=" in GMMA in function 'k'"

ADVICE=$serialized bash "$guard" "$work/fake-nvcc" -c a.cu -o "$work/a.o" 2>"$work/a.err"
status=$?
(( status == 1 )) || fail "serialised MMAs: exit $status, expected 1"
[[ ! -e $work/a.o ]] || fail "serialised MMAs: the object was kept"
grep -q "(C7520)" "$work/a.err" || fail "serialised MMAs: the advisory was not passed on"
grep -q "error: ptxas serialised the warpgroup MMAs of a kernel compiled into $work/a.o" "$work/a.err" ||
  fail "serialised MMAs: no error naming the object: $(cat "$work/a.err")"

ADVICE=$injected bash "$guard" "$work/fake-nvcc" -c b.cu -o "$work/b.o" 2>"$work/b.err"
status=$?
(( status == 0 )) || fail "C7519 only: exit $status, expected 0"
[[ -s $work/b.o ]] || fail "C7519 only: the object is missing"
grep -q "(C7519)" "$work/b.err" || fail "C7519 only: the advisory was not passed on"

waits="ptxas info    : (C7517) warpgroup.wait is injected in around line 56 by compiler to allow use of registers"
waits+=" defined by GMMA in function 'k'"
ADVICE=$waits bash "$guard" "$work/fake-nvcc" -c e.cu -o "$work/e.o" 2>"$work/e.err"
status=$?
(( status == 1 )) || fail "injected wait: exit $status, expected 1"
[[ ! -e $work/e.o ]] || fail "injected wait: the object was kept"

STATUS=3 ADVICE="error: something" bash "$guard" "$work/fake-nvcc" -c c.cu -o "$work/c.o" 2>"$work/c.err"
status=$?
(( status == 3 )) || fail "failing compile: exit $status, expected the compiler's 3"
grep -q "error: something" "$work/c.err" || fail "failing compile: its message was not passed on"

bash "$guard" 2>"$work/d.err"
status=$?
(( status == 2 )) || fail "no command: exit $status, expected 2"
grep -q "usage:" "$work/d.err" || fail "no command: no usage line"
if [[ -z $nvcc ]]; then
  echo "ok (stand-in compilers; the real-compiler cases need a CUDA compiler: none configured)"
  exit 0
fi
compile() {  # snippet → exit status of the guarded compile; stderr in $work/<snippet>.err
  bash "$guard" "$nvcc" -gencode=arch=compute_90a,code=sm_90a -c "$snippets/$1.cu" -o "$work/$1.o" \
    2>"$work/$1.err"
}
compile arrive_injected
status=$?
(( status == 0 )) || fail "nvcc, arrive_injected.cu: exit $status, expected 0: $(cat "$work/arrive_injected.err")"
[[ -s $work/arrive_injected.o ]] || fail "nvcc, arrive_injected.cu: no object"
grep -q "(C7519)" "$work/arrive_injected.err" || fail "nvcc, arrive_injected.cu: no C7519 advisory (ptxas changed?)"
for snippet in serialised wait_injected; do
  compile $snippet
  status=$?
  (( status == 1 )) || fail "nvcc, $snippet.cu: exit $status, expected 1: $(cat "$work/$snippet.err")"
  [[ ! -e $work/$snippet.o ]] || fail "nvcc, $snippet.cu: the object was kept"
done
grep -q "wgmma.mma_async instructions are serialized" "$work/serialised.err" ||
  fail "nvcc, serialised.cu: no serialisation advisory"
grep -q "warpgroup.wait is injected" "$work/wait_injected.err" ||
  fail "nvcc, wait_injected.cu: no injected-wait advisory"
echo "ok (stand-in compilers and $nvcc)"
