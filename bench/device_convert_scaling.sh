#!/usr/bin/env bash
# The --workers scaling curve of `moebake convert` on the GPU machine's 16 CPU cores. Run ON THE
# DEVICE, from the repo root (as the GPU host runs it), with ".whl/bench" carried
# (made here by bench/device_wheels.sh: numba, llvmlite, xxhash, psutil and moebake's pure-Python
# dependencies, cp312 manylinux x86_64; each is installed only if the machine lacks it):
#
#   bench/device_convert_scaling.sh [LAYERS] [WORKERS...]      # default: 24 layers (13.8 GB), workers 1 2 4 8
#   CACHE_STATES=cold bench/device_convert_scaling.sh ...      # page-cache states (default: cold warm)
#   VARIANTS="plain I/O,write depth 1" VARIANT_WORKERS="1 8" bench/device_convert_scaling.sh ...   # also with these off
#   PYTHON=.venv/bin/python CACHE=DIR EXPERTS=2 HIDDEN=64 VOCAB=64 bench/device_convert_scaling.sh 1 1   # a tiny run (CI's smoke test)
#
# It generates a GPT-OSS-20B-shaped source under /tmp (the machine's local disk; kept while the
# machine stays warm, so a second call skips it), runs bench/convert_bench.py there (cp vs
# moebake convert, cold and warm page cache) and writes convert_bench_16core.{md,csv} and this
# script's log to $OUT. Redraw the plot on the CPU box from the CSV:
#   .venv/bin/python bench/convert_bench.py --plot-only --results DIR --name convert_bench_16core
set -euo pipefail
cd "$(dirname "$0")/.."
LAYERS="${1:-24}"
shift || true
WORKERS=("${@:-1 2 4 8}")
OUT="${OUT:-/tmp/moebake-bench-out}"
PYTHON="${PYTHON:-python3}"
CACHE="${CACHE:-/tmp/moebake-bench-cache}"
SITE=/tmp/moebake-bench-site
mkdir -p "$OUT" "$SITE"
exec > >(tee -a "$OUT/device_convert_scaling.log") 2>&1
echo "== $(date -u +%H:%M:%S) $(nproc) cores, $("$PYTHON" --version), $(df -h /tmp | tail -1)"

# Install, from the carried wheels, only what this Python lacks (a wheel name -> its module).
declare -A MODULE=([numba]=numba [llvmlite]=llvmlite [xxhash]=xxhash [psutil]=psutil [click]=click [tqdm]=tqdm
  [pyyaml]=yaml [safetensors]=safetensors [huggingface_hub]=huggingface_hub [filelock]=filelock [fsspec]=fsspec
  [packaging]=packaging [typing_extensions]=typing_extensions [hf_xet]=hf_xet [httpx2]=httpx2 [httpcore2]=httpcore2
  [anyio]=anyio [h11]=h11 [idna]=idna [truststore]=truststore)
missing=()
shopt -s nullglob
for wheel in .whl/bench/*.whl; do
  name="$(basename "$wheel" | cut -d- -f1 | tr 'A-Z' 'a-z')"
  module="${MODULE[$name]:-$name}"
  PYTHONPATH="$SITE" "$PYTHON" -c "import $module" 2>/dev/null || missing+=("$wheel")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing into $SITE: ${missing[*]##*/}"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "${missing[@]}"
fi
export PYTHONPATH="$SITE:$PWD"
"$PYTHON" -c "import torch, numpy, numba, xxhash; print('torch', torch.__version__, '| numpy', numpy.__version__, '| numba', numba.__version__, '| xxhash', xxhash.VERSION)"

IFS=, read -ra VARIANT_LIST <<< "${VARIANTS:-}"  # comma-separated variant labels
echo "== $(date -u +%H:%M:%S) benchmark: $LAYERS layers, workers ${WORKERS[*]}"
# shellcheck disable=SC2068
# shellcheck disable=SC2086
"$PYTHON" bench/convert_bench.py --layers "$LAYERS" --generate-layers "$LAYERS" --workers ${WORKERS[@]} \
  --experts "${EXPERTS:-32}" --hidden "${HIDDEN:-2880}" ${VOCAB:+--vocab "$VOCAB"} \
  --cache-states ${CACHE_STATES:-cold warm} --cache "$CACHE" --results "$OUT" \
  ${VARIANTS:+--variants "${VARIANT_LIST[@]}" --variant-workers ${VARIANT_WORKERS:-${WORKERS[0]}}} \
  --name "${NAME:-convert_bench_16core}" --no-plot
echo "== $(date -u +%H:%M:%S) done"
