"""Decoding a file of prompts: what `gpt-ft generate --input` runs (batches of prompts padded on the
left, the shortest together) against the same prompts one at a time, and against transformers'
`generate` on the same weights and the same padded batches.

    python benchmarks/bench_generate.py --weights weights/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --texts GLUE_DIR/SST-2/dev.tsv
    python benchmarks/bench_generate.py --preset gpt-mini      (random weights in GPT-2's block order)

Greedy, `--new` tokens a prompt (every prompt decodes as many: no end token), fp32; the prompts are
the first 2 to 12 words of `--texts`'s sentences (or of generated ones). Ours runs twice each way:
as it is, and with each product of a few rows on one thread, as `F.linear` runs it on a CPU
(`gpt_ft.model.linear`). Prints new tokens/s of each (median of interleaved runs, with the range),
and whether their tokens are identical.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

import harness
import torch
from bench_label import texts_from
from paths import existing

from gpt_ft import GPT, GPTConfig
from gpt_ft.data.tokenizer import load_tokenizer, train_tokenizer
from gpt_ft.eval.batched_decoding import by_length, continue_prompts, left_padded
from gpt_ft.eval.generation import prompt_ids
from gpt_ft.model import linear


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--weights", default=None, help="a GGUF file or transformers folder (with its tokenizer)"
    )
    parser.add_argument(
        "--preset", default="gpt-mini", help="random weights of this shape, without --weights"
    )
    parser.add_argument("--texts", type=existing, default=None, help="a tsv with a sentence column (SST-2's)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new", type=int, default=32, help="new tokens a prompt")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    rng = random.Random(0)
    texts = [" ".join(t.split()[: rng.randint(2, 12)]) for t in texts_from(args.texts, args.prompts)]
    with tempfile.TemporaryDirectory() as work:
        if args.weights:
            gpt, tok = GPT.from_pretrained(args.weights), load_tokenizer(args.weights)
        else:
            corpus = Path(work) / "corpus.txt"
            corpus.write_text("\n".join(texts_from(args.texts, 2000)))
            tok = train_tokenizer(
                inputs=[corpus], vocab_size=1000, out_dir=f"{work}/tok", show_progress=False
            )
            gpt = GPT(GPTConfig.from_name(args.preset, vocab_size=len(tok), pre_ln=True))  # GPT-2's order
        gpt = gpt.eval()
        hf = gpt.to_hf().eval()
    prompts = [prompt_ids(tok, t) for t in texts]
    decode = dict(eos_token_id=None)
    out: dict[str, list[list[int]]] = {}

    def ours(batch: int, split: bool = True):
        def run() -> None:
            rows, linear.ROWS = linear.ROWS, linear.ROWS if split else 0
            try:
                out[f"ours-{batch}-{split}"] = continue_prompts(gpt, prompts, batch, args.new, decode)
            finally:
                linear.ROWS = rows

        return run

    def theirs() -> None:
        new = [[] for _ in prompts]
        for batch in by_length(prompts, args.batch):
            ids, mask = left_padded([prompts[i] for i in batch])
            tokens = hf.generate(
                ids, attention_mask=mask, max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False,
                pad_token_id=0, eos_token_id=None,
            )  # fmt: skip
            for row, i in enumerate(batch):
                new[i] = tokens[row, ids.shape[1] :].tolist()
        out["transformers"] = new

    contenders = {f"ours, batch {args.batch}": ours(args.batch), "ours, one at a time": ours(1)}
    contenders[f"ours, batch {args.batch}, one thread a product"] = ours(args.batch, split=False)
    contenders["ours, one at a time, one thread a product"] = ours(1, split=False)
    contenders[f"transformers, batch {args.batch}"] = theirs
    with torch.no_grad():
        stats = harness.interleaved(contenders, runs=args.runs)
    total = args.new * len(prompts)
    source = args.weights or f"{args.preset} (random weights)"
    shortest, longest = min(map(len, prompts)), max(map(len, prompts))
    print(f"{len(prompts)} prompts of {shortest} to {longest} tokens, {args.new} new tokens each, greedy, "
          f"fp32, {torch.get_num_threads()} threads; {source}")  # fmt: skip
    for name, s in stats.items():
        print(f"  {name}: {s.rate(total)} new tokens/s")
    base = stats[f"ours, batch {args.batch}"].median
    print(f"  batch {args.batch} over one at a time: {stats['ours, one at a time'].median / base:.2f}x; "
          f"over transformers: {stats[f'transformers, batch {args.batch}'].median / base:.2f}x")  # fmt: skip
    for name in (f"batch {args.batch}", "one at a time"):
        split = stats[f"ours, {name}, one thread a product"].median / stats[f"ours, {name}"].median
        print(f"  {name}, products split over the threads over one thread a product: {split:.2f}x")
    same = all(tokens == out[f"ours-{args.batch}-True"] for tokens in out.values())
    print(f"  identical tokens: all {len(out)} ways {same}")


if __name__ == "__main__":
    main()
