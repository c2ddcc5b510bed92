#!/usr/bin/env bash
# Checks for what hybridtb builds, tests and reports with, and installs only what is missing from
# the Debian 12 / Ubuntu 24.04 packages (apt-get, with sudo when not root).
#
#   install-deps.sh [--check] [--report-optional]
#
# What is checked is the thing itself, wherever it came from (apt, pip, a tarball, a module
# system): a tool on PATH with a usable version, a header or library the compiler finds, a Python
# module one of the interpreters the scripts use (/usr/bin/python3, then python3 on PATH) can
# import. Three groups:
#   build   C++20 compiler, cmake >= 3.24, ninja, pkg-config, python3; Eigen 3, HDF5 (C), nlohmann
#           json >= 3.10, CLI11, GoogleTest + GoogleMock, Google Benchmark
#   test    Python modules h5py, numpy (interoperability tests)
#   report  Python modules nbconvert, ipykernel, matplotlib (the HTML reports, render-report.sh)
# --check            report what is missing (with the package that provides it) and install
#                    nothing; exit 0 if nothing is missing, 1 otherwise.
# --report-optional  the report group may stay missing: it is named as a warning, not an error
#                    (main-job.sh then writes the JSON without the HTML).
# Exit status: 0 everything needed is present (after installing); 1 something needed is still
# missing (each item named, with why it could not be installed); 2 usage error.
set -uo pipefail

check_only=0
report_optional=0
for arg in "$@"; do
  case "$arg" in
    --check) check_only=1 ;;
    --report-optional) report_optional=1 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-deps: unknown argument '$arg' (expected --check, --report-optional)" >&2; exit 2 ;;
  esac
done

# The interpreters whose modules count (the order tests/CMakeLists.txt and render-report.sh use).
pythons=()
[ -x /usr/bin/python3 ] && pythons+=(/usr/bin/python3)
if command -v python3 >/dev/null 2>&1 && [ "$(command -v python3)" != /usr/bin/python3 ]; then
  pythons+=("$(command -v python3)")
fi

# Include and library directories a Debian install or a prefix uses, for the compile checks.
cflags=(-I/usr/include/eigen3 -I/usr/include/hdf5/serial -L/usr/lib/x86_64-linux-gnu/hdf5/serial
        -L/usr/lib/aarch64-linux-gnu/hdf5/serial)
if command -v pkg-config >/dev/null 2>&1; then
  for pc in eigen3 hdf5; do
    # shellcheck disable=SC2207
    pkg-config --exists "$pc" 2>/dev/null && cflags+=($(pkg-config --cflags --libs-only-L "$pc"))
  done
fi
prefix_path="${CMAKE_PREFIX_PATH:-}"
for prefix in ${prefix_path//:/ } /usr/local; do
  [ -d "$prefix/include" ] && cflags+=("-I$prefix/include" "-I$prefix/include/eigen3")
  [ -d "$prefix/lib" ] && cflags+=("-L$prefix/lib")
done

cxx="${CXX:-}"
if [ -z "$cxx" ]; then
  for candidate in c++ g++ clang++; do
    if command -v "$candidate" >/dev/null 2>&1; then cxx="$candidate"; break; fi
  done
fi
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# compiles SOURCE [FLAGS...]: 0 if the C++20 program compiles and links (libraries as FLAGS).
compiles() {
  local source="$1"; shift
  [ -n "$cxx" ] || return 1
  printf '%s\n' "$source" > "$scratch/t.cpp"
  "$cxx" -std=c++20 "${cflags[@]}" "$scratch/t.cpp" -o "$scratch/t" "$@" -pthread >"$scratch/log" 2>&1
}

# has_header SOURCE: 0 if the preprocessor finds every header SOURCE includes and reaches no
# #error (quick: nothing is parsed).
has_header() {
  [ -n "$cxx" ] || return 1
  printf '%s\n' "$1" > "$scratch/h.cpp"
  "$cxx" -std=c++20 "${cflags[@]}" -E "$scratch/h.cpp" -o /dev/null >"$scratch/log" 2>&1
}

# has_lib NAME...: 0 if the linker finds libNAME for each (a trivial program linked against them).
has_lib() {
  local libs=() name
  for name in "$@"; do libs+=("-l$name"); done
  compiles 'int main() { return 0; }' -Wl,--no-as-needed "${libs[@]}"
}

# version_at_least HAVE NEED: dotted versions.
version_at_least() {
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]
}

python_imports() {
  local py
  for py in "${pythons[@]}"; do
    "$py" -c "import $1" >/dev/null 2>&1 && return 0
  done
  return 1
}

missing=()   # "group|what|why|apt package"
need() { missing+=("$1|$2|$3|$4"); }

# --- build: tools -------------------------------------------------------------------------------
if [ -z "$cxx" ]; then
  need build "C++ compiler" "no c++, g++ or clang++ on PATH" build-essential
elif ! compiles 'int main() { return 0; }'; then
  need build "C++ compiler" "$cxx cannot build a C++20 program: $(head -1 "$scratch/log")" build-essential
fi
if ! command -v cmake >/dev/null 2>&1; then
  need build "cmake" "not on PATH" cmake
else
  v="$(cmake --version 2>/dev/null | head -1 | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -1)"
  version_at_least "${v:-0}" 3.24 || need build "cmake" "cmake ${v:-of unknown version} on PATH, 3.24 or newer needed" cmake
fi
command -v ninja >/dev/null 2>&1 || need build "ninja" "not on PATH" ninja-build
command -v pkg-config >/dev/null 2>&1 || need build "pkg-config" "not on PATH" pkg-config
[ ${#pythons[@]} -gt 0 ] || need build "python3" "not on PATH" python3

# --- build: headers and libraries ----------------------------------------------------------------
if [ -z "$cxx" ]; then
  # Nothing can be checked without a compiler (a fresh machine): all of them go with it.
  for item in "Eigen 3 headers:libeigen3-dev" "HDF5 C library:libhdf5-dev" "nlohmann json >= 3.10:nlohmann-json3-dev" \
              "CLI11:libcli11-dev" "GoogleTest:libgtest-dev" "GoogleMock:libgmock-dev" "Google Benchmark:libbenchmark-dev"; do
    need build "${item%%:*}" "cannot be checked without a C++ compiler" "${item##*:}"
  done
else
  has_header '#include <Eigen/Core>' || need build "Eigen 3 headers" "<Eigen/Core> not found" libeigen3-dev
  { has_header '#include <hdf5.h>' && has_lib hdf5; } ||
    need build "HDF5 C library" "<hdf5.h> or libhdf5 not found" libhdf5-dev
  has_header '#include <nlohmann/json.hpp>
#if NLOHMANN_JSON_VERSION_MAJOR < 3 || (NLOHMANN_JSON_VERSION_MAJOR == 3 && NLOHMANN_JSON_VERSION_MINOR < 10)
#error nlohmann json older than 3.10
#endif' || need build "nlohmann json >= 3.10" "<nlohmann/json.hpp> not found or older than 3.10" nlohmann-json3-dev
  has_header '#include <CLI/CLI.hpp>' || need build "CLI11" "<CLI/CLI.hpp> not found" libcli11-dev
  { has_header '#include <gtest/gtest.h>' && has_lib gtest gtest_main; } ||
    need build "GoogleTest" "<gtest/gtest.h> or libgtest not found" libgtest-dev
  { has_header '#include <gmock/gmock.h>' && has_lib gmock; } ||
    need build "GoogleMock" "<gmock/gmock.h> or libgmock not found" libgmock-dev
  { has_header '#include <benchmark/benchmark.h>' && has_lib benchmark; } ||
    need build "Google Benchmark" "<benchmark/benchmark.h> or libbenchmark not found" libbenchmark-dev
fi

# --- test and report: Python modules -------------------------------------------------------------
for entry in test:h5py:python3-h5py test:numpy:python3-numpy report:nbconvert:"jupyter-nbconvert python3-nbconvert" \
             report:ipykernel:python3-ipykernel report:matplotlib:python3-matplotlib; do
  IFS=: read -r group module pkgs <<<"$entry"
  if [ ${#pythons[@]} -eq 0 ]; then
    need "$group" "Python module $module" "no python3" "$pkgs"
  elif ! python_imports "$module"; then
    need "$group" "Python module $module" "not importable by ${pythons[*]}" "$pkgs"
  fi
done

# is_needed GROUP: 0 if a missing item of GROUP makes this run fail.
is_needed() { [ "$1" != report ] || [ "$report_optional" -eq 0 ]; }

# report: one line per missing item; returns 1 if a needed one is among them.
report() {
  local item group what why pkgs rc=0
  for item in "${missing[@]}"; do
    IFS='|' read -r group what why pkgs <<<"$item"
    if is_needed "$group"; then
      echo "install-deps: missing [$group] $what: $why (Debian/Ubuntu package: $pkgs)"
      rc=1
    else
      echo "install-deps: missing [$group] $what: $why (Debian/Ubuntu package: $pkgs); optional here: the" \
           "HTML reports cannot be rendered without it"
    fi
  done
  return $rc
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: everything present (build, test, report)"
  exit 0
fi
if [ "$check_only" -eq 1 ]; then
  report
  exit $?
fi

report
pkgs=()
for item in "${missing[@]}"; do
  IFS='|' read -r _ _ _ p <<<"$item"
  # shellcheck disable=SC2206
  pkgs+=($p)
done
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
why_not=""
if ! command -v apt-get >/dev/null 2>&1; then
  why_not="no apt-get on this machine: install the items above by other means"
elif [ -n "$sudo" ] && ! command -v sudo >/dev/null 2>&1; then
  why_not="not root and no sudo: install the items above as root"
else
  echo "install-deps: installing ${pkgs[*]}"
  if ! $sudo apt-get update -qq; then
    why_not="apt-get update failed (no network or no package mirror?)"
  elif ! DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${pkgs[@]}"; then
    why_not="apt-get install ${pkgs[*]} failed"
  fi
fi
[ -n "$why_not" ] && echo "install-deps: could not install: $why_not"

# The same checks again, in a fresh process (new PATH entries and modules are seen).
optional=()
[ "$report_optional" -eq 1 ] && optional=(--report-optional)
if bash "$0" --check "${optional[@]}"; then
  exit 0
fi
echo "install-deps: error: the items above are still missing" >&2
exit 1
