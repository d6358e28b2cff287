#!/usr/bin/env bash
# Installs the Python oracles the oracle tests run (PyTorch, transformers, tiktoken, ...) and the
# cuDNN frontend's headers into a virtual environment, once: $LAYUP_VENV, else ~/.cache/layup/venv
# (~6 GB; about 10 minutes on a clean machine, most of it downloading).
set -euo pipefail

venv=${LAYUP_VENV:-$HOME/.cache/layup/venv}
oracles=(torch transformers tiktoken safetensors numpy pytest regex)
if ! "$venv/bin/python" -c "import torch, transformers, tiktoken, safetensors, numpy, pytest, regex" 2>/dev/null; then
  echo "installing the Python oracles into $venv"
  python3 -m venv "$venv" || { apt-get install -y -qq -o DPkg::Lock::Timeout=600 python3-venv && python3 -m venv "$venv"; }
  "$venv/bin/pip" install -q --upgrade pip
  # --no-compile: the oracles import a small part of these packages, compiled on first import;
  # byte-compiling all ~11,600 files at install takes about a CPU-minute from the builds beside it.
  "$venv/bin/pip" install -q --no-compile "${oracles[@]}"
fi
# The cuDNN frontend's headers, which the CUDA build compiles its fused attention against (torch
# brings cuDNN itself). Only the headers are used, so not the package's Python dependencies.
if ! "$venv/bin/python" -c "import importlib.util; assert importlib.util.find_spec('cudnn')" 2>/dev/null; then
  "$venv/bin/pip" install -q --no-deps nvidia-cudnn-frontend
fi
