#!/usr/bin/env bash
# Download, here, the wheels that scripts/device_bench.sh installs on a GPU machine without network:
# transformers when the image's is not 5.24.x (the project pins one minor: the cache API moves), and
# faiss-cpu, which the image lacks.
#
#   bash scripts/prepare_wheels.sh            # into wheels/ (about 36 MB with regex and faiss; the carry limit is 64 MiB)
#   run(command="bash scripts/device_bench.sh", carry=["wheels"], timeout_s=540)
#
# The wheels are for the device image's CPython 3.12 on x86-64 manylinux: transformers and the libraries
# whose versions it checks at import (tokenizers, safetensors, regex), at the project's versions, and
# faiss-cpu (about 18 MB; the image has none, and the recall index imports it; its numpy and packaging
# come with the image).
# huggingface_hub is left to the image (its 1.x satisfies transformers 5.24's >=1.31; hub 2.x would need
# httpx2, which the image lacks).
# wheels/ is in .gitignore: never committed, carried because the run names it in `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-wheels}
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST" "transformers==5.24.*" "tokenizers>=0.23.1,<0.24" "safetensors>=0.8" "regex>=2025.10.22" \
  "faiss-cpu>=1.8"
ls -l "$DEST"
total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
echo "total $((total / 1024 / 1024)) MiB in $DEST/ (carry limit 64 MiB, working tree included)"
[ "$total" -lt $((60 * 1024 * 1024)) ] || { echo "too large to carry" >&2; exit 1; }
