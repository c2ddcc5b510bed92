#!/usr/bin/env bash
# Renders the report notebooks (notebooks/*.ipynb, committed without outputs) to HTML by executing
# them headless: render-report.sh OUTDIR [benchmark|parity ...] (default: both).
# render-report.sh --check: only says whether rendering is possible here (exit 0) or which Python
# modules are missing (exit 1).
# Inputs come from the environment (defaults: the committed samples in experiments/results/):
#   BENCH_RESULTS   hybridtb_bench results JSON files (':'-separated, globs allowed)
#   PARITY_REPORTS  hybridtb parity/replay --report JSON files (':'-separated, globs allowed)
# Needs the Python modules nbconvert, ipykernel, matplotlib (harness/scripts/install-deps.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
check_only=0
if [ "${1:-}" = --check ]; then
  check_only=1
else
  out="${1:?usage: render-report.sh OUTDIR [benchmark|parity ...] | render-report.sh --check}"
  shift
fi
which=("$@")
[ ${#which[@]} -eq 0 ] && which=(benchmark parity)

# The interpreter: the first of the system one (Debian's packages) and python3 on PATH (pip, a
# venv) that imports all three modules, the order install-deps.sh checks them in.
candidates=()
[ -x /usr/bin/python3 ] && candidates+=(/usr/bin/python3)
if command -v python3 >/dev/null 2>&1 && [ "$(command -v python3)" != /usr/bin/python3 ]; then
  candidates+=("$(command -v python3)")
fi
python=""
for candidate in "${candidates[@]}"; do
  if "$candidate" -c "import nbconvert, ipykernel, matplotlib" >/dev/null 2>&1; then
    python="$candidate"
    break
  fi
done
if [ -z "$python" ]; then
  missing=()
  first="${candidates[0]:-python3}"
  "$first" -c "import nbconvert" >/dev/null 2>&1 || missing+=("nbconvert (jupyter-nbconvert)")
  "$first" -c "import ipykernel" >/dev/null 2>&1 || missing+=("ipykernel (python3-ipykernel)")
  "$first" -c "import matplotlib" >/dev/null 2>&1 || missing+=("matplotlib (python3-matplotlib)")
  [ ${#missing[@]} -gt 0 ] || missing+=("one interpreter with nbconvert, ipykernel and matplotlib together")
  echo "render-report: missing Python module(s) ${missing[*]} in ${candidates[*]:-no python3}" \
       "(install with: bash harness/scripts/install-deps.sh)" >&2
  [ "$check_only" -eq 1 ] && exit 1
  # Under CTest on a machine that never ran install-deps.sh (the GPU machine has no network), the
  # test skips with this reason; the README's test command sets HYBRIDTB_REQUIRE_NOTEBOOKS=1, so in
  # CI a failed install is a failure, not a skip.
  if [ -n "${HYBRIDTB_NOTEBOOKS_SKIP_CODE:-}" ] && [ "${HYBRIDTB_REQUIRE_NOTEBOOKS:-0}" != 1 ]; then
    exit "$HYBRIDTB_NOTEBOOKS_SKIP_CODE"
  fi
  exit 1
fi
[ "$check_only" -eq 1 ] && exit 0

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
