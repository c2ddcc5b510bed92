#!/usr/bin/env bash
# The main job: install the dependencies, build everything, then on the shipped datasets
#   1. the parity run of the best backend present: `hybridtb parity --backend cuda --against
#      reference` of datasets/examples and datasets/recorded on a machine with a GPU, otherwise
#      `hybridtb replay --backend reference` of the recorded expectations (datasets/recorded);
#   2. a quick benchmark of the standard mixes (experiments/suites/quick.json);
#   3. the report: both JSON files plus the notebooks rendered to HTML (plots included),
# all in one output directory (default build/report/<UTC date>, or $1), named at the end.
# Exit status: 0 everything passed; 1 a parity mismatch or a failed benchmark case (the report is
# still written); anything else: the build or a tool failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-build/report/$(date -u +%Y-%m-%d)}"
bash harness/scripts/install-deps.sh
bash harness/scripts/build.sh
mkdir -p "$out"
out="$(cd "$out" && pwd)"
hybridtb=./build/harness/cli/hybridtb
status=0

echo "== parity"
if "$hybridtb" backends 2>/dev/null | grep -q '^ *cuda' && nvidia-smi -L >/dev/null 2>&1; then
  parity=(parity --backend cuda --against reference datasets/examples/*.h5 datasets/recorded/*.h5)
else
  echo "main-job: no GPU backend here: replaying the recorded expectations on the reference"
  parity=(replay --backend reference datasets/recorded/*.h5)
fi
echo "\$ hybridtb ${parity[*]} --report $out/parity.json"
"$hybridtb" "${parity[@]}" --quiet --no-rationale --report "$out/parity.json" || status=1

echo "== quick benchmark"
./build/experiments/hybridtb_bench --suite experiments/suites/quick.json --out "$out/bench.json" \
  --benchmark_out="$out/bench_gbench.json" --benchmark_out_format=json || status=1

echo "== report"
BENCH_RESULTS="$out/bench.json" PARITY_REPORTS="$out/parity.json" \
  bash harness/scripts/render-report.sh "$out"
{
  echo "# hybridtb report ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown))"
  echo
  echo "- parity: \`hybridtb ${parity[*]}\` → [parity.json](parity.json), [parity_report.html](parity_report.html)"
  echo "- quick benchmark: experiments/suites/quick.json → [bench.json](bench.json), [benchmark_report.html](benchmark_report.html)"
  echo "  (Google Benchmark's own JSON: bench_gbench.json)"
  echo
  echo "Compare with another run: \`build/experiments/hybridtb_bench_compare OTHER.json $out/bench.json\`"
} > "$out/README.md"
echo
echo "main-job: report written to $out (README.md, parity.json, parity_report.html, bench.json, benchmark_report.html; figures in *_report_files/)"
exit $status
