#!/usr/bin/env bash
# Installs the system packages hybridtb builds and tests with (Debian 12 / Ubuntu 24.04), using
# sudo when not root. Skips apt entirely when everything is already installed.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libeigen3-dev libhdf5-dev hdf5-tools nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-h5py python3-numpy
  jupyter-nbconvert python3-nbconvert python3-ipykernel python3-matplotlib
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
