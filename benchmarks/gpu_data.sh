#!/usr/bin/env bash
# The data gpu_ablation.py reads, packed small enough to travel with a device call: the books, SST-2,
# RTE, STS-B and Story Cloze as one xz archive (about a third of their 120 MB) in .data/ (ignored by
# git, carried by the call; see benchmarks/README.md). Give the folder that holds lm/books, glue/
# and storycloze/:
#   bash benchmarks/gpu_data.sh ../shared/data
set -euo pipefail
data=${1:?give the data folder that holds lm/books, glue and storycloze}
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p .data "$(dirname "$exclude")"
grep -qx '/.data/' "$exclude" 2>/dev/null || echo '/.data/' >> "$exclude"
tar -cf - -C "$data" lm/books glue/SST-2 glue/RTE glue/STS-B storycloze | xz -6 -T0 > .data/ablation.tar.xz
du -h .data/ablation.tar.xz
