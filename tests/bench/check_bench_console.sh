#!/usr/bin/env bash
# check_bench_console.sh BENCH SUITE OUT.json: runs hybridtb_bench on SUITE with stdout and stderr
# redirected to files (not a terminal, as in CI or `> log`) and checks what a user reads there:
# one compact row per benchmark (no line of a run longer than 121 columns except a skip/error
# reason or a flag such as [throttled]), no colour escape codes, the table's columns, the summary, and no Google Benchmark
# "Library was built as DEBUG" warning (at most our own one-line note about it).
set -uo pipefail
bench="$1" suite="$2" out="$3"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
"$bench" --suite "$suite" --no-ceilings --out "$out" >"$dir/stdout" 2>"$dir/stderr"
rc=$?
cat "$dir/stdout" "$dir/stderr"
fail() { echo "check_bench_console: FAIL: $*"; exit 1; }
[ "$rc" -eq 0 ] || fail "exit status $rc, expected 0"
if grep -q $'\033' "$dir/stdout" "$dir/stderr"; then fail "colour escape codes in redirected output"; fi
head -1 "$dir/stdout" | grep -Eq '^benchmark .* status +median +latency +iqr% +GB/s +TFLOP/s +%roof$' ||
  fail "no table header with name, status, median, latency, GB/s, TFLOP/s, %roof"
# (a flagged GPU row, "  [throttled]", may run longer too)
long=$(grep -Ev '^[^ ].* (skipped|error) |  \[' "$dir/stdout" | awk 'length($0) > 121' | grep -v '^results: ')
[ -z "$long" ] || fail "lines wider than 121 columns: $long"
rows=$(grep -Ec ' (ok|skipped|error) ' "$dir/stdout")
listed=$("$bench" --suite "$suite" --list | wc -l)
[ "$rows" -eq "$listed" ] || fail "$rows rows for $listed benchmarks"
grep -Eq '^[0-9]+ ok, [0-9]+ skipped, 0 failed' "$dir/stdout" || fail "no summary line"
if grep -q 'built as DEBUG' "$dir/stdout" "$dir/stderr"; then fail "Google Benchmark's DEBUG warning printed"; fi
[ "$(grep -c 'Google Benchmark library was compiled without NDEBUG' "$dir/stderr")" -le 1 ] || fail "note printed twice"
echo "check_bench_console: ok ($rows rows)"
