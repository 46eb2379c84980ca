#!/usr/bin/env bash
# Performance at real model sizes: the `bench sweep` suite on one GPU machine, in one call.
#
# What it does, in order (no network is needed or used):
#   1. reports what the image has: python3, torch and its CUDA device, transformers;
#   2. if transformers is missing or not 5.24.x, or faiss is missing (the image has no faiss-cpu), installs
#      the wheels carried in $WHEELS (default wheels/) into /tmp/site and puts them first on PYTHONPATH;
#      without a faiss wheel the sweep skips hermes+recall with a note and measures the other policies;
#   3. installs hermes from this working tree (`pip install --no-deps --no-build-isolation -e .`), or,
#      if that fails, links the source folders into /tmp/hermes_pkg and uses PYTHONPATH;
#   4. runs the sweep on random-weight LLaVA-OV-7B in bf16 (built on the GPU, `--arch llava-ov-7b`),
#      policies full, sliding, hermes, hermes+recall at a 4096-token budget, 16 to 1024 frames, chunks of 16 and 8,
#      then Qwen2.5-VL-7B the same way if the qwen2_5_vl adapter exists and time is left;
#   5. the issue-21 extras, into extras.md (each under its own time limit, in the EXTRAS_S kept back from
#      the sweeps): the probe's transient memory against the KV cache at the first model's geometry
#      (`bench device --sections probe`), preprocessing on the host vs the device and decode eager vs
#      `torch.compile`d (`bench device --sections preprocess,decode`; the CPU dry run skips compiling), recall
#      and FAISS search over 10^4 / 10^5 records (`bench tiers`), the ingest rate of a 1080p file (`bench
#      ingest`), and `bench reference` when REF_DIR and REF_PYTHON name a reference checkout and its environment;
#   6. writes <arch>.json and <arch>.md per model, targets.md (scripts/check_targets.py on LLaVA-OV-7B),
#      extras.md, env.txt and log.txt under $OUT (8 files, the tool's limit), and prints the tables.
# Each sweep rewrites its JSON and markdown after every stream, so a run cut short by its time limit
# still returns what it measured. Designed to finish in under 8 minutes on an H100/H200.
#
# Usage (GPU, through the device tool, from the repository root):
#   run(command="bash scripts/device_bench.sh", carry=["wheels"], timeout_s=540)  # TOTAL_S=450 + slack
# CPU dry run here (small random models, a few lengths; writes under runs/device_bench unless $OUT is set):
#   DEVICE=cpu bash scripts/device_bench.sh
#
# Carried wheels (transformers when the image's is not 5.24.x, 2026-11 images had 5.17; faiss-cpu, which the
# image lacks, for the recall policy and `bench tiers`):
#   bash scripts/prepare_wheels.sh      # transformers 5.24, tokenizers, safetensors, regex, faiss-cpu: ~36 MB
# huggingface_hub is not carried: the image's 1.x satisfies transformers 5.24 (>=1.31), and hub 2.x
# would need httpx2, which the image does not have.
#
# Knobs (environment): DEVICE (cuda|cpu), OUT, WHEELS, TOTAL_S (time budget, default 450),
# LENGTHS, CHUNKS, POLICIES, BUDGET, DECODE_TOKENS, REPEATS, EXTRAS_S (default 240), REF_DIR, REF_PYTHON.
set -uo pipefail
cd "$(dirname "$0")/.."
START_S=$(date +%s)
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-runs/device_bench}
WHEELS=${WHEELS:-wheels}
TOTAL_S=${TOTAL_S:-450}
EXTRAS_S=${EXTRAS_S:-240}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
PY=${PYTHON:-python3}
if [ "$DEVICE" = cpu ]; then
  [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
  # one thread unless told otherwise: on a shared CPU, OpenMP threads contending with other work run
  # many times slower than one (the dry run proves the steps, not speed)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi

elapsed() { echo $(( $(date +%s) - START_S )); }
say() { echo "[device_bench $(elapsed)s] $*"; }

main() {
# ---- 1. what the image has ---------------------------------------------------------------------------
say "device=$DEVICE out=$OUT python=$(command -v "$PY")"
{
  "$PY" --version
  "$PY" - <<'EOF'
import importlib
for name in ("torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "numpy", "cv2", "yaml", "faiss"):
    try:
        print(f"{name:16} {importlib.import_module(name).__version__}")
    except Exception as exc:  # report, do not fail: step 2 may fix it
        print(f"{name:16} missing ({type(exc).__name__})")
import torch
print("cuda available  ", torch.cuda.is_available(), torch.version.cuda,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
} | tee "$OUT/env.txt"
if [ "$DEVICE" != cpu ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  say "no CUDA device visible to torch: nothing to measure (DEVICE=cpu runs the dry run)"; return 2
fi

# ---- 2. transformers 5.24 and faiss, from the carried wheels where the image lacks them -----------------------
wheels=()
if ! "$PY" -c "import sys, transformers; sys.exit(transformers.__version__[:5] != '5.24.')" 2>/dev/null; then
  for w in "$WHEELS"/*.whl; do [[ -f $w && $(basename "$w") != faiss_cpu-* ]] && wheels+=("$w"); done
  if [ ${#wheels[@]} -eq 0 ]; then
    say "transformers is not 5.24.x and no wheels in $WHEELS/: run scripts/prepare_wheels.sh and carry wheels"; return 3
  fi
fi
if ! "$PY" -c "import faiss" 2>/dev/null; then  # the recall index (hermes+recall, bench tiers) needs it
  if ls "$WHEELS"/faiss_cpu-*.whl >/dev/null 2>&1; then wheels+=("$WHEELS"/faiss_cpu-*.whl)
  else say "faiss is not importable and no faiss_cpu wheel in $WHEELS/: the sweep skips hermes+recall"; fi
fi
if [ ${#wheels[@]} -gt 0 ]; then
  say "installing carried wheels: $(basename -a "${wheels[@]}" | tr '\n' ' ')"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "${wheels[@]}" || { say "wheel install failed"; return 3; }
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c "import transformers; print('transformers in use', transformers.__version__, transformers.__file__)" \
  >> "$OUT/env.txt" || { say "transformers does not import (see above)"; return 3; }
tail -1 "$OUT/env.txt"

# ---- 3. hermes from this tree ----------------------------------------------------------------------------
if ! "$PY" -c "import hermes.models.realsize" 2>/dev/null; then
  if ! "$PY" -m pip install -q --no-deps --no-build-isolation -e . ; then
    say "editable install failed: using PYTHONPATH over linked source folders"
    rm -rf /tmp/hermes_pkg && mkdir -p /tmp/hermes_pkg/hermes
    cp -r hermes/. /tmp/hermes_pkg/hermes/
    for sub in models pipelines datasets configs; do ln -s "$PWD/$sub" "/tmp/hermes_pkg/hermes/$sub"; done
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/hermes_pkg"
  fi
fi
"$PY" -c "import hermes, hermes.models.realsize; print('hermes', hermes.__version__, hermes.__file__)" \
  || { say "hermes does not import"; return 4; }

# ---- 4. the sweeps -----------------------------------------------------------------------------------------
if [ "$DEVICE" = cpu ]; then
  # the same steps at small sizes: the CPU benchmark model, then the tiny Qwen2.5-VL for the second model
  MODELS=("cpu-small:--arch cpu-small" "tiny-qwen2.5-vl:--model tiny-qwen2.5-vl")
  LENGTHS=${LENGTHS:-16,32,64}; CHUNKS=${CHUNKS:-16,8}; BUDGET=${BUDGET:-256}
  DECODE_TOKENS=${DECODE_TOKENS:-4}; REPEATS=${REPEATS:-1}; DTYPE=float32
else
  MODELS=("llava-ov-7b:--arch llava-ov-7b" "qwen2.5-vl-7b:--arch qwen2.5-vl-7b")
  LENGTHS=${LENGTHS:-16,32,64,128,256,512,1024}; CHUNKS=${CHUNKS:-16,8}; BUDGET=${BUDGET:-4096}
  DECODE_TOKENS=${DECODE_TOKENS:-16}; REPEATS=${REPEATS:-3}; DTYPE=bfloat16
fi
POLICIES=${POLICIES:-full,sliding,hermes,hermes+recall}  # recall last in each chunk size: cut first when time runs short
status=0
for i in "${!MODELS[@]}"; do
  name=${MODELS[$i]%%:*}; model_args=${MODELS[$i]#*:}
  if [[ $name == qwen* || $name == *qwen2.5* ]] && \
     ! "$PY" -c "import sys; from hermes.models.loading import ADAPTERS; sys.exit('qwen2_5_vl' not in ADAPTERS)"; then
    say "$name: skipped, this build has no qwen2_5_vl adapter"; continue
  fi
  left=$(( TOTAL_S - $(elapsed) ))
  # the first model (the one the targets are about) gets 55% of the time left, the last one the rest
  limit=$(( i + 1 < ${#MODELS[@]} ? ((left - EXTRAS_S) * 11) / 20 : left - EXTRAS_S - 10 ))
  if [ "$limit" -lt 60 ]; then say "$name: skipped, only ${left}s of the time budget left (${EXTRAS_S}s of it kept for the extras)"; continue; fi
  say "$name: sweep (limit ${limit}s)"
  # shellcheck disable=SC2086  # model_args is two words on purpose
  timeout --signal=INT --kill-after=15 "$limit" "$PY" -m hermes bench sweep $model_args --device "$DEVICE" \
    --dtype "$DTYPE" --policies "$POLICIES" --lengths "$LENGTHS" --chunk-frames "$CHUNKS" --budget "$BUDGET" \
    --decode-tokens "$DECODE_TOKENS" --repeats "$REPEATS" --output "$OUT/$name.json" --markdown "$OUT/$name.md"
  rc=$?
  if [ $rc -ne 0 ]; then
    say "$name: exit code $rc (124/130: time limit; the files hold what was measured)"; status=$rc
    [ -f "$OUT/$name.md" ] && cat "$OUT/$name.md"
  fi
  # The targets (benchmarks/RESULTS.md) are set for LLaVA-OV-7B (the first model); the verdict does not change the exit code
  if [ "$i" -eq 0 ] && [ -f "$OUT/$name.json" ]; then
    "$PY" scripts/check_targets.py "$OUT/$name.json" --policy hermes --chunk 16 | tee "$OUT/targets.md"
  fi
done
# ---- 5. extras (issue 21) ------------------------------------------------------------------------------------
extra() {  # extra SECONDS TITLE COMMAND...: one section of extras.md, cut at its time limit
  local limit=$1 title=$2; shift 2
  local left=$(( TOTAL_S - $(elapsed) ))  # the sweeps stopped EXTRAS_S before TOTAL_S
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 20 ]; then echo "## $title: skipped (time budget spent)" >> "$OUT/extras.md"; return; fi
  say "extra: $title (limit ${limit}s)"
  { echo "## $title"; echo; echo '```'; echo "\$ $*"; } >> "$OUT/extras.md"
  timeout --signal=INT --kill-after=10 "$limit" "$@" >> "$OUT/extras.md" 2>&1 || echo "(exit $?)" >> "$OUT/extras.md"
  echo '```' >> "$OUT/extras.md"
}
: > "$OUT/extras.md"
first_arch=${MODELS[0]#*--arch }; first_arch=${first_arch%% *}
# the CPU dry run proves the steps at small sizes; the GPU run measures at the 7B geometry
if [ "$DEVICE" = cpu ]; then probe_tokens=256; records=200; write_mib=4; video_s=4
  device_args=(--sections preprocess --chunk-frames 2 --repeats 1)  # compiling decode takes minutes on a CPU
else probe_tokens=7232; records=10000; write_mib=16; video_s=12
  device_args=(--sections preprocess,decode --tokens 4096 --chunk-frames 16 --decode-tokens 32 --repeats 3); fi
extra 60 "probe transient memory vs KV cache ($first_arch)" \
  "$PY" -m hermes bench device --sections probe --arch "$first_arch" --device "$DEVICE" --dtype "$DTYPE" \
  --tokens "$probe_tokens"
extra 150 "preprocess on host vs device, decode eager vs compiled ($first_arch)" \
  "$PY" -m hermes bench device --arch "$first_arch" --device "$DEVICE" --dtype "$DTYPE" "${device_args[@]}"
extra 120 "recall and search ($records records)" \
  "$PY" -m hermes bench tiers --records "$records" --write-mib "$write_mib"
extra 120 "ingest of a 1080p file (cpu-small, decode on a reader thread)" \
  "$PY" -m hermes bench ingest --seconds "$video_s"
if [ -n "${REF_DIR:-}" ] && [ -n "${REF_PYTHON:-}" ]; then
  extra 240 "ours vs the reference (bench reference)" \
    "$PY" -m hermes bench reference --ref-dir "$REF_DIR" --ref-python "$REF_PYTHON" --geometries 4x64,8x512
else
  echo "## bench reference: skipped (set REF_DIR and REF_PYTHON to a reference checkout and its environment)" \
    >> "$OUT/extras.md"
fi
cat "$OUT/extras.md"
say "done; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
return $status
}

main 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
