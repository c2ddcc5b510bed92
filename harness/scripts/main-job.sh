#!/usr/bin/env bash
# The main job: install the dependencies, build everything, then on the shipped datasets
#   1. the parity run of the best backend present: `hybridtb parity --backend cuda --against
#      reference` of datasets/examples and datasets/recorded on a machine with a GPU, otherwise
#      `hybridtb replay --backend reference` of the recorded expectations (datasets/recorded);
#   2. a quick benchmark of the standard mixes (experiments/suites/quick.json);
#   3. the report: both JSON files plus the notebooks rendered to HTML (plots included),
# all in one output directory (default build/report/<UTC date>, or $1), named at the end.
# Before anything is built it checks for what it needs (install-deps.sh, installing only what is
# missing) and stops there, naming it, if a build dependency is absent. If only the HTML
# rendering is impossible (nbconvert, ipykernel or matplotlib absent and not installable, as on a
# machine without network), it says so at the start and still writes parity.json and bench.json.
# Exit status: 0 everything passed (with or without the HTML, as said); 1 a parity mismatch, a
# failed benchmark case, or a rendering that failed (the JSON is still written); anything else:
# a dependency, the build or a tool failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-build/report/$(date -u +%Y-%m-%d)}"
if ! bash harness/scripts/install-deps.sh --report-optional; then
  echo "main-job: stopping before the build: the dependencies named above are missing" >&2
  exit 2
fi
render=1
if ! render_missing="$(bash harness/scripts/render-report.sh --check 2>&1)"; then
  render=0
  echo "main-job: note: the HTML reports will not be rendered: ${render_missing#render-report: }"
  echo "main-job: parity.json and bench.json will still be written"
fi
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
render_cmd="BENCH_RESULTS=$out/bench.json PARITY_REPORTS=$out/parity.json bash harness/scripts/render-report.sh $out"
html=""
if [ "$render" -eq 1 ]; then
  if BENCH_RESULTS="$out/bench.json" PARITY_REPORTS="$out/parity.json" bash harness/scripts/render-report.sh "$out"; then
    html="rendered"
  else
    echo "main-job: rendering the HTML reports failed (output above); the JSON files are written" >&2
    html="failed: see the main job's output; rerun: $render_cmd"
    status=1
  fi
else
  echo "main-job: HTML reports not rendered: ${render_missing#render-report: }"
  html="not rendered: ${render_missing#render-report: }; once installed: $render_cmd"
fi
{
  echo "# hybridtb report ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown))"
  echo
  if [ "$html" = rendered ]; then
    echo "- parity: \`hybridtb ${parity[*]}\` → [parity.json](parity.json), [parity_report.html](parity_report.html)"
    echo "- quick benchmark: experiments/suites/quick.json → [bench.json](bench.json), [benchmark_report.html](benchmark_report.html)"
  else
    echo "- parity: \`hybridtb ${parity[*]}\` → [parity.json](parity.json)"
    echo "- quick benchmark: experiments/suites/quick.json → [bench.json](bench.json)"
    echo "- HTML reports $html"
  fi
  echo "  (Google Benchmark's own JSON: bench_gbench.json)"
  echo
  echo "Compare with another run: \`build/experiments/hybridtb_bench_compare OTHER.json $out/bench.json\`"
} > "$out/README.md"
echo
if [ "$html" = rendered ]; then
  echo "main-job: report written to $out (README.md, parity.json, parity_report.html, bench.json, benchmark_report.html; figures in *_report_files/)"
else
  echo "main-job: report written to $out (README.md, parity.json, bench.json); HTML reports $html"
fi
exit $status
