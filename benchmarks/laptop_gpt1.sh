#!/usr/bin/env bash
# GPT-1's thesis on a laptop: pretrain a small GPT on the books for an hour on the CPU, then fine-tune
# it and the same model from scratch on SST-2, RTE, STS-B and Story Cloze (3 seeds each), beside a
# TF-IDF baseline and the paper's figures. Writes runs/laptop/report.md and report.png, then the
# learning curves (100 to 3000 labels) in runs/laptop/curves.
#   bash benchmarks/laptop_gpt1.sh [DATA]     # DATA holds lm/books, glue/ and storycloze/
# The recipe (measured on 2 cores; see the README's "GPT-1 on a laptop"): a byte-level BPE of 8192
# tokens; gpt-mini's shape (4 layers, 256 wide, 4 heads) with pre-LN blocks (GPT-1's post-LN stalls
# at the unigram loss for hundreds of steps at this size); context 256, 16 sequences a step, no
# dropout (less than one pass over the books), AdamW at 1e-3 with 200 warmup steps and a cosine over
# 3400 steps (about 45 minutes of steps in bf16 on 2 AMD EPYC cores, plus validation), stopped at 60
# minutes at the latest (Muon reaches a lower perplexity in the same time but transferred less to
# SST-2: docs/results.md, "Spending the hour"; --pretrain-optimizer muon to try it);
# fine-tuning in bf16 too (fp32 where the CPU has no fast bf16). Run again, it keeps the pretrained model and the
# fine-tuning runs already done (delete runs/laptop/pretrain to pretrain again). The two rows
# fine-tune side by side, one core each; their output goes to runs/laptop/<row>.log.
set -euo pipefail
data=${1:?usage: bash benchmarks/laptop_gpt1.sh DATA (a folder holding lm/books, glue/ and storycloze/)}
cd "$(dirname "$0")/.."
pip_extra=$(python -c "import sklearn" 2>/dev/null && echo "" || echo "(scikit-learn missing: pip install -e '.[bench]' for the TF-IDF row)")
[ -n "$pip_extra" ] && echo "$pip_extra"
# --tokens: 3400 steps of 16 x 256
recipe=(--device cpu --out runs/laptop --books "$data/lm/books" --glue "$data/glue" --storycloze "$data/storycloze"
    --vocab-size 8192 --context 256 --batch-size 16 --shape "pre_ln: true" --pretrain-lr 1e-3
    --warmup-steps 200 --tokens 13926400 --minutes 60 --finetune-lr 2.5e-4 1e-3 --seeds 0 1 2)
# 1. tokenizer, tokens, pretraining (skipped when a pretrained model is there)
if ! ls runs/laptop/pretrain/lightning_logs/*/checkpoints/last.ckpt >/dev/null 2>&1; then
    python benchmarks/bench_ablation.py "${recipe[@]}" --rows
fi
# 2. the two rows side by side, one core each: small models gain little from a second thread
pids=()
for row in pretrained "from scratch"; do
    echo "fine-tuning the $row row: runs/laptop/${row// /-}.log"
    OMP_NUM_THREADS=1 python benchmarks/bench_ablation.py "${recipe[@]}" --skip-pretraining --rows "$row" \
        > "runs/laptop/${row// /-}.log" 2>&1 &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || { echo "a fine-tuning row failed: see runs/laptop/*.log"; exit 1; }; done
# 3. the table and the chart (every run is done now: this only reads them, plus the TF-IDF row)
python benchmarks/bench_ablation.py "${recipe[@]}" --skip-pretraining $( [ -z "$pip_extra" ] && echo --tfidf ) \
    --report runs/laptop/report.md
# 4. label efficiency: the same two rows on 100 to 3000 labelled SST-2 and RTE examples (3 seeds; the
# suite resumes), TF-IDF on the same subsets drawn beside them: runs/laptop/curves/results.md and
# learning_curves.png
ckpt=$(ls runs/laptop/pretrain/lightning_logs/*/checkpoints/last.ckpt | tail -1)
baselines=()
if [ -z "$pip_extra" ]; then
    python benchmarks/tfidf_baseline.py --glue "$data/glue" --storycloze "$data/storycloze" \
        --train-sizes 100 300 1000 3000 --json runs/laptop/curves/tfidf.json
    baselines=(--baselines runs/laptop/curves/tfidf.json)
fi
gpt-ft suite configs/suites/label_efficiency.yaml --out_dir runs/laptop/curves --init_from "$ckpt" \
    --tokenizer runs/laptop/tokenizer --data_dir "$data/glue" --select best ${baselines[@]+"${baselines[@]}"}
