#!/usr/bin/env bash
# Renders the report notebooks (notebooks/*.ipynb, committed without outputs) to HTML by executing
# them headless: render-report.sh OUTDIR [benchmark|parity ...] (default: both).
# Inputs come from the environment (defaults: the committed samples in experiments/results/):
#   BENCH_RESULTS   hybridtb_bench results JSON files (':'-separated, globs allowed)
#   PARITY_REPORTS  hybridtb parity/replay --report JSON files (':'-separated, globs allowed)
# Needs jupyter-nbconvert, python3-ipykernel, python3-matplotlib (harness/scripts/install-deps.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:?usage: render-report.sh OUTDIR [benchmark|parity ...]}"
shift
which=("$@")
[ ${#which[@]} -eq 0 ] && which=(benchmark parity)

# The system interpreter carries the Debian packages (a pyenv/venv python3 first in PATH may not).
python=/usr/bin/python3
[ -x "$python" ] || python="$(command -v python3)"
missing=()
"$python" -c "import nbconvert" 2>/dev/null || missing+=("jupyter-nbconvert/python3-nbconvert")
"$python" -c "import ipykernel" 2>/dev/null || missing+=("python3-ipykernel")
"$python" -c "import matplotlib" 2>/dev/null || missing+=("python3-matplotlib")
if [ ${#missing[@]} -gt 0 ]; then
  echo "render-report: missing ${missing[*]} (install with: bash harness/scripts/install-deps.sh)" >&2
  # Under CTest on a machine that never ran install-deps.sh (the GPU machine has no network), the
  # test skips with this reason; the README's test command sets HYBRIDTB_REQUIRE_NOTEBOOKS=1, so in
  # CI a failed install is a failure, not a skip.
  if [ -n "${HYBRIDTB_NOTEBOOKS_SKIP_CODE:-}" ] && [ "${HYBRIDTB_REQUIRE_NOTEBOOKS:-0}" != 1 ]; then
    exit "$HYBRIDTB_NOTEBOOKS_SKIP_CODE"
  fi
  exit 1
fi

mkdir -p "$out"
export HYBRIDTB_ROOT="$root"
export PYDEVD_DISABLE_FILE_VALIDATION=1  # quiets debugpy's frozen-modules warning in the kernel
for name in "${which[@]}"; do
  nb="$root/notebooks/${name}_report.ipynb"
  [ -f "$nb" ] || { echo "render-report: no notebook $nb" >&2; exit 2; }
  # --execute runs in the notebook's folder; the kernel is the system python3 kernelspec.
  # The classic template keeps the page small and self-contained; the figures go to
  # OUTDIR/<name>_report_files/*.png beside it (ExtractOutputPreprocessor) instead of base64 blobs
  # inside the page, so committed reports stay diffable.
  "$python" -m nbconvert --to html --execute --template classic --ExtractOutputPreprocessor.enabled=True \
    --ExecutePreprocessor.timeout=600 --ExecutePreprocessor.kernel_name=python3 --output-dir "$out" "$nb"
  echo "render-report: $out/${name}_report.html"
done
