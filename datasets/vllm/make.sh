#!/usr/bin/env bash
# Regenerates the golden batches of datasets/vllm/ from manifest.json on a GPU machine (torch,
# triton, h5py): per entry, in this directory,
#   1. its generator_command (`hybridtb gen ...`);
#   2. a probe: a copy recorded on the reference and run through vLLM's kernels with gen's
#      NaN-filled null block, reporting how many real output rows vLLM turns into NaN (kept nowhere);
#   3. experiments/peers/vllm_golden.py prepare FILE [its prepare options]: block 0 zeroed as vLLM
#      allocates it, the optional per-tensor fp8 scales;
#   4. `hybridtb record --backend reference` (the builders' metadata, an input of vLLM's kernel);
#   5. vllm_golden.py run --vllm DIR/<entry's vllm>: /expected from vLLM's kernels;
# then rewrites the manifest with each file's sha256, size and the canonical generator_command the
# file stores.
#
#   datasets/vllm/make.sh --vllm-src DIR [--hybridtb PATH] [NAME...]
#
# DIR holds one unpacked release per version: DIR/0.33.0/vllm/..., DIR/0.12.0/vllm/...
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
hybridtb="$root/build/harness/cli/hybridtb"
vllm_src=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hybridtb) hybridtb="$(realpath "$2")"; shift 2 ;;
    --vllm-src) vllm_src="$(realpath "$2")"; shift 2 ;;
    *) break ;;
  esac
done
[[ -x "$hybridtb" ]] || { echo "make.sh: no hybridtb executable at $hybridtb (pass --hybridtb PATH)" >&2; exit 2; }
[[ -d "$vllm_src" ]] || { echo "make.sh: pass --vllm-src DIR (DIR/<version>/vllm)" >&2; exit 2; }
py="${PYTHON:-python3}"
golden="$root/experiments/peers/vllm_golden.py"

cd "$here"
mapfile -t lines < <("$py" -c '
import json, sys
m = json.load(open("manifest.json"))
want = set(sys.argv[1:])
for e in m["datasets"]:
    if not want or e["name"] in want:
        print(e["name"], e["file"], e["vllm"], e["generator_command"], e.get("prepare", ""), sep="\t")
' "$@")
failed=0
for line in "${lines[@]}"; do
  IFS=$'\t' read -r name file version command prepare <<<"$line"
  [[ "$command" == "hybridtb gen "* ]] || { echo "make.sh: $name: command must start with 'hybridtb gen'" >&2; exit 2; }
  echo "== $name (vllm $version): $command"
  rm -f "$file" "$file.probe" "$file.golden"
  read -r -a words <<<"${command#hybridtb }"
  "$hybridtb" "${words[@]}" --quiet
  cp "$file" "$file.probe"
  "$hybridtb" record --quiet --backend reference "$file.probe"
  echo -n "   probe with gen's NaN null block: "
  "$py" "$golden" run --vllm "$vllm_src/$version" "$file.probe" || true
  rm -f "$file.probe"
  read -r -a pwords <<<"$prepare"
  "$py" "$golden" prepare "$file" "${pwords[@]}"
  "$hybridtb" record --quiet --backend reference "$file"
  if "$py" "$golden" run --vllm "$vllm_src/$version" "$file" --out "$file.golden" \
      --command "python3 experiments/peers/vllm_golden.py run --vllm <vllm-src>/$version $file --out $file"; then
    mv "$file.golden" "$file"
  else
    echo "make.sh: $name: vLLM's output has NaN rows or the run failed" >&2
    failed=1
  fi
done
"$py" - <<'PY'
import hashlib, json, os
m = json.load(open("manifest.json"))
for e in m["datasets"]:
    if os.path.exists(e["file"]):
        e["sha256"] = hashlib.sha256(open(e["file"], "rb").read()).hexdigest()
        e["bytes"] = os.path.getsize(e["file"])
        import h5py  # the canonical command `hybridtb gen` stored in the file
        with h5py.File(e["file"], "r") as f:
            stored = f.attrs["generator_command"]
        e["generator_command"] = stored.decode() if isinstance(stored, bytes) else str(stored)
with open("manifest.json.tmp", "w") as f:
    json.dump(m, f, indent=2)
    f.write("\n")
os.replace("manifest.json.tmp", "manifest.json")
print(f"manifest.json: {len(m['datasets'])} entries, {sum(e.get('bytes', 0) for e in m['datasets']) / 2**20:.2f} MiB")
PY
exit $failed
