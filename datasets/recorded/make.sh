#!/usr/bin/env bash
# Regenerates every file of datasets/recorded/ from manifest.json: runs each entry's
# generator_command (`hybridtb gen ...`, run in this directory), then its optional post_command
# (a script here, run with /usr/bin/python3: h5py), records /expected with
# `hybridtb record --backend reference`, then rewrites the manifest with each file's sha256 and
# the generator_command the file itself stores (the canonical form `hybridtb gen` records).
#
#   datasets/recorded/make.sh [--hybridtb PATH] [NAME...]     (default: build/harness/cli/hybridtb)
#
# Needs a python3 (json only) to read and update the manifest. NAMEs restrict the run to entries.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
hybridtb="$root/build/harness/cli/hybridtb"
if [[ "${1:-}" == "--hybridtb" ]]; then hybridtb="$(realpath "$2")"; shift 2; fi
[[ -x "$hybridtb" ]] || { echo "make.sh: no hybridtb executable at $hybridtb (pass --hybridtb PATH)" >&2; exit 2; }
py="$(command -v /usr/bin/python3 || command -v python3)"
h5py_py=/usr/bin/python3

cd "$here"
# One line per entry: name<TAB>file<TAB>command<TAB>post_command
mapfile -t lines < <("$py" -c '
import json, sys
m = json.load(open("manifest.json"))
want = set(sys.argv[1:])
for e in m["datasets"]:
    if not want or e["name"] in want:
        print(e["name"], e["file"], e["generator_command"], e.get("post_command", ""), sep="\t")
' "$@")
for line in "${lines[@]}"; do
  IFS=$'\t' read -r name file command post <<<"$line"
  [[ "$command" == "hybridtb gen "* ]] || { echo "make.sh: $name: command must start with 'hybridtb gen'" >&2; exit 2; }
  rm -f "$file"
  echo "== $name: $command"
  # The command is a plain word list (no quoting or shell syntax): split on spaces.
  read -r -a words <<<"${command#hybridtb }"
  "$hybridtb" "${words[@]}"
  if [[ -n "${post:-}" ]]; then  # a post-processing script of this directory (features gen cannot express)
    echo "   post: $post"
    read -r -a pwords <<<"$post"
    "$h5py_py" "./${pwords[0]}" "${pwords[@]:1}"
  fi
  "$hybridtb" record --quiet --backend reference "$file"
done
# Refresh sha256 and the stored generator_command of every entry whose file exists.
"$py" - "$h5py_py" <<'PY'
import hashlib, json, os, subprocess, sys
m = json.load(open("manifest.json"))
for e in m["datasets"]:
    if not os.path.exists(e["file"]):
        continue
    e["sha256"] = hashlib.sha256(open(e["file"], "rb").read()).hexdigest()
    e["bytes"] = os.path.getsize(e["file"])
    try:
        stored = subprocess.run([sys.argv[1], "-c", "import h5py, sys; print(h5py.File(sys.argv[1], 'r').attrs['generator_command'])", e["file"]],
                                check=True, capture_output=True, text=True).stdout.strip()
        e["generator_command"] = stored
    except Exception as err:  # no h5py: keep the manifest's command
        print(f"make.sh: {e['name']}: could not read generator_command ({err})", file=sys.stderr)
with open("manifest.json.tmp", "w") as f:
    json.dump(m, f, indent=2)
    f.write("\n")
os.replace("manifest.json.tmp", "manifest.json")
print(f"manifest.json: {len(m['datasets'])} entries, {sum(e.get('bytes', 0) for e in m['datasets']) / 2**20:.2f} MiB")
PY
