#!/usr/bin/env bash
# `layup sample`'s speed (issue 44), by bench/sample_speed.py:
#   bench/sample_speed.sh [cpu]   GPT-2 124M's shape (random weights) on the CPU: 512 new tokens
#                                 with the key/value cache and with --no-kv-cache; the ratio
#   bench/sample_speed.sh h200    Llama 3.2 1B's shape (random weights) on the GPU in bf16: layup
#                                 with and without the cache against transformers' generate, the
#                                 same prompt ids, prefill and decode tokens/s apart
# LAYUP_BIN: the layup binary (default build-cpu/layup); OUT: where the model folder and the
# report go (default /tmp/sample_speed); PYTHON: a python with torch and transformers (default
# the layup venv's where there is one, else python3). Extra arguments go to sample_speed.py.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-cpu}
[ $# -gt 0 ] && shift
python=${PYTHON:-}
if [ -z "$python" ]; then
  python=python3
  [ -x "$HOME/.cache/layup/venv/bin/python" ] && python=$HOME/.cache/layup/venv/bin/python
fi
exec "$python" "$repo/bench/sample_speed.py" --mode "$mode" \
  --layup "${LAYUP_BIN:-$repo/build-cpu/layup}" --out "${OUT:-/tmp/sample_speed}" "$@"
