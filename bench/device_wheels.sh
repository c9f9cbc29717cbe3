#!/usr/bin/env bash
# Download, HERE (CPU box with PyPI), the cp312 manylinux x86_64 wheels that bench/device_convert_scaling.sh
# installs on the GPU machine (Python 3.12, torch 2.11, no network) into .whl/bench/ (ignored by git;
# carry ".whl/bench"). moebake's converter needs numba (+ llvmlite) and xxhash; the rest are its
# pure-Python dependencies and psutil (the benchmark's RSS/CPU polling), each installed there only
# if the machine lacks it. numpy is left out (the torch image has it; it would not fit).
#
# A copy to the GPU host carries at most 64 MiB, and llvmlite's wheel alone is 60 MB (zip deflate): it is
# recompressed here with LZMA (zip method 14, which pip's installer reads), to ~41 MB, same files
# and RECORD. That takes a few minutes once. Total: ~53 MB.
#
#   bench/device_wheels.sh            # -> .whl/bench/*.whl, prints their total size
#   DEST=DIR PYTHON=PY bench/device_wheels.sh   # elsewhere, with another Python (CI's smoke test stubs pip's download)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${DEST:-$ROOT/.whl/bench}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
mkdir -p "$DEST"
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
  -d "$DEST" numba llvmlite xxhash psutil click tqdm pyyaml safetensors huggingface_hub
rm -f "$DEST"/numpy-*.whl  # a dependency of numba: the device has it
"$PY" - "$DEST"/llvmlite-*.whl <<'PY'
import os, sys, zipfile
for wheel in sys.argv[1:]:
    with zipfile.ZipFile(wheel) as source:
        if all(info.compress_type == zipfile.ZIP_LZMA for info in source.infolist()):
            continue
        packed = wheel + ".lzma"
        with zipfile.ZipFile(packed, "w") as target:
            for info in source.infolist():
                target.writestr(info, source.read(info.filename), compress_type=zipfile.ZIP_LZMA)
    os.replace(packed, wheel)
    print(f"recompressed {os.path.basename(wheel)}: {os.path.getsize(wheel) / 1e6:.1f} MB")
PY
ls -1 "$DEST"
du -sh "$DEST"
