#!/usr/bin/env bash
# Download, HERE (CPU box with PyPI), the cp312 manylinux x86_64 wheels that bench/device_convert_scaling.sh
# installs on the GPU machine (Python 3.12, torch 2.11, no network) into .whl/bench/ (ignored by git;
# carry ".whl/bench"). moebake's converter needs numba (+ llvmlite) and xxhash; the rest are its
# pure-Python dependencies and psutil (the benchmark's RSS/CPU polling), each installed there only
# if the machine lacks it. numpy is included for a machine without it (torch images have it).
#
#   bench/device_wheels.sh            # -> .whl/bench/*.whl, prints their total size (carry limit: 64 MiB)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.whl/bench"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
mkdir -p "$DEST"
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
  -d "$DEST" numba llvmlite xxhash psutil click tqdm pyyaml safetensors huggingface_hub numpy
ls -1 "$DEST"
du -sh "$DEST"
