#!/usr/bin/env bash
# Installs what layup needs to build (Debian packages), then builds it into build/.
#   ./scripts/setup.sh            Release build
#   BUILD_DIR=... CMAKE_ARGS=...  to build elsewhere or with other options
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ cmake make libeigen3-dev nlohmann-json3-dev libcli11-dev libgtest-dev libomp-dev
  libpcre2-dev libutf8proc-dev libopenmpi-dev openmpi-bin)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

build_dir=${BUILD_DIR:-build}
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
cmake --build "$build_dir" -j "$(nproc)"
echo "built $build_dir/layup"
