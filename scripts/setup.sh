#!/usr/bin/env bash
# Installs what layup needs to build (Debian packages), then builds it into build/.
#   ./scripts/setup.sh [cmake options]     Release build
#   BUILD_DIR=... CMAKE_ARGS=...           to build elsewhere or with other options
#   BUILD_TARGETS="a b"                    to build only those targets (and what they need)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ cmake make ninja-build libeigen3-dev nlohmann-json3-dev libcli11-dev libgtest-dev
  libomp-dev libpcre2-dev libutf8proc-dev libopenmpi-dev openmpi-bin)
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
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq -o DPkg::Lock::Timeout=600 "${missing[@]}"
fi

build_dir=${BUILD_DIR:-build}
# Ninja for a new build folder: it starts a library's sources without waiting for the libraries
# below it to be archived, so both cores stay busy through the layers. A folder keeps the
# generator it was made with.
generator=()
[ -f "$build_dir/CMakeCache.txt" ] || generator=(-G Ninja)
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} "$@"
targets=()
for target in ${BUILD_TARGETS:-}; do targets+=(--target "$target"); done
cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}"
echo "built ${BUILD_TARGETS:-everything} in $build_dir"
