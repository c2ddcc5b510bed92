#!/usr/bin/env bash
# optimized/cmake/wgmma-serialization-guard.sh around stand-in compilers: a compile whose ptxas
# output reports serialised warpgroup MMAs fails (exit 1), its object removed and the advisory
# passed on; one reporting only an injected warpgroup.arrive (C7519) passes with its object; a
# failing compile keeps its own exit status; no command at all is a usage error (exit 2).
set -uo pipefail
guard=$1
work=$2
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
serialized="ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are serialized due to program dependence on compiler-inserted WG.AR in divergent path in the function 'k'"
injected="ptxas info    : (C7519) warpgroup.arrive is injected in around line 10 by compiler to allow use of registers in GMMA in function 'k'"

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

STATUS=3 ADVICE="error: something" bash "$guard" "$work/fake-nvcc" -c c.cu -o "$work/c.o" 2>"$work/c.err"
status=$?
(( status == 3 )) || fail "failing compile: exit $status, expected the compiler's 3"
grep -q "error: something" "$work/c.err" || fail "failing compile: its message was not passed on"

bash "$guard" 2>"$work/d.err"
status=$?
(( status == 2 )) || fail "no command: exit $status, expected 2"
grep -q "usage:" "$work/d.err" || fail "no command: no usage line"
echo "ok"
