#!/usr/bin/env bash
# The wheels a lent GPU machine lacks, for its CPython 3.12 on x86-64 Linux, into .whl/ (ignored by
# git, carried by the device call; see benchmarks/README.md). Its image already holds torch 2.11,
# lightning, transformers, tokenizers, safetensors, torchmetrics, matplotlib, pandas, pyarrow,
# fsspec, xxhash, pyyaml and huggingface-hub: what is missing is datasets and jsonargparse (with
# its signatures extra) and their small pure-Python dependencies. Run where pip reaches PyPI:
#   bash benchmarks/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
# The versions the test suite runs with (pip list in the project's venv).
WHEELS=(
    datasets==5.2.0
    dill==0.4.1
    multiprocess==0.70.19
    jsonargparse==4.53.0
    docstring_parser==0.18.0
    typeshed_client==2.14.0
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl "${WHEELS[@]}"
du -sh .whl
ls .whl
