"""Process rewards on PRMBench, step by step: gpt_ft's training step against transformers' token
classifier's, on the same solutions, in turns in one process, so that a busy machine slows both
alike (bench_steps.py times whole runs, which a machine's changing load moves by up to 2x).

PRMBench is split as bench_steps.py splits it; `--train-size` keeps the first training solutions.
Each of gpt_ft's batches of `tasks/steps/prmbench.yaml` (`--batch-size` solutions, packed; on a CPU
laid flat, the elementwise work fused) and the same solutions as the Trainer's side has them
(gpt_ft's token ids, labels at each extract token, `DataCollatorForTokenClassification`'s padding,
`*ForTokenClassification` from the same weights) take one training step each, in turns, the order
swapped every batch: forward, backward, gradient clipping at 1.0, AdamW (gpt_ft's own optimizer; the
Trainer's default, the fused `adamw_torch_fused`, on its decay groups). One untimed step of each on
the first batch comes first (gpt_ft compiles its fused kernels there). Prints each batch's real
tokens, the Trainer's padded positions, both times and their ratio, and the totals.

    python benchmarks/bench_steps_paired.py --prmbench PRMBENCH_DIR \\
        --init-from weights/SmolLM2-135M-Instruct.Q4_1.gguf --train-size 128 --bf16
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import bench_steps  # noqa: E402  (PRMBench's split, the arguments, the Trainer's token ids)
import bench_vs_trainer  # noqa: E402  (the model folder)
import peers  # noqa: E402  (the Trainer's model)


def main() -> None:
    args = bench_steps.prmbench_arguments(
        __doc__, ["ours", "Trainer"], batch=8, unit="solutions", out="runs/bench_steps_paired"
    )
    if not args.init_from:
        sys.exit("give --init-from: both sides start from the same pretrained weights")
    args.seed = 0  # the Trainer's new head, drawn as bench_steps.py draws it
    args.attention = "sdpa"  # (peers.peer_model's: the Trainer's attention, as bench_steps.py's default)
    from transformers import (
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        Trainer,
    )

    from gpt_ft.adapters.cards import load_card
    from gpt_ft.data.task_data import TaskDataModule
    from gpt_ft.training.module import GPTModule
    from gpt_ft.training.optim import adamw, fused_adamw

    data, _ = bench_steps.split_prmbench(args, args.out)
    args.base = base = bench_vs_trainer.base_folder(args, "pretrained", args.out)
    rows = [
        json.loads(line) for line in bench_steps.encoded_steps(args, base, data, args.out)["train"].open()
    ]
    card = load_card(bench_steps.CARD)
    module = TaskDataModule(
        card, str(base), data_dir=str(data), max_length=args.max_length, batch_size=args.batch_size
    )
    module.setup("fit")
    batches = list(module.train_dataloader())
    ours = GPTModule(init_from=str(base), task=card, tokenizer=str(base), lr=args.lr, weight_decay=0.01)
    ours_optimizer = adamw(ours.parameters(), **ours.optim, fused=fused_adamw(ours.device))
    tokenizer = AutoTokenizer.from_pretrained(base)
    peer = peers.peer_model(AutoModelForTokenClassification, args, tokenizer, num_labels=2)
    decay = set(
        Trainer.get_decay_parameter_names(None, peer)
    )  # the Trainer's groups: no decay on norms, biases
    groups = [[p for n, p in peer.named_parameters() if (n in decay) == d] for d in (True, False)]
    groups = [{"params": groups[0], "weight_decay": 0.01}, {"params": groups[1], "weight_decay": 0.0}]
    peer_optimizer = torch.optim.AdamW(groups, lr=args.lr, fused=True)  # its default, adamw_torch_fused
    collator = DataCollatorForTokenClassification(tokenizer)
    ours.train(), peer.train()

    def step(model, optimizer, loss_of) -> float:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = loss_of()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - start

    def sides(batch) -> dict:
        padded = collator([rows[i] for i in batch.index.tolist()])
        return {
            "ours": lambda: step(ours, ours_optimizer, lambda: ours.losses(batch)[0]),
            "Trainer": lambda: step(peer, peer_optimizer, lambda: peer(**padded).loss),
            "positions": padded["input_ids"].numel(),
        }

    first = sides(batches[0])
    first["ours"](), first["Trainer"]()  # untimed: gpt_ft compiles its fused kernels here
    print(f"{len(batches)} batches of {args.batch_size} solutions, {'bf16' if args.bf16 else 'fp32'}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    print(f"{'tokens':>7} {'padded':>7} {'ours s':>7} {'Trainer s':>9} {'ratio':>6}")
    total = {"ours": 0.0, "Trainer": 0.0}
    for k, batch in enumerate(batches):
        side = sides(batch)
        times = {name: side[name]() for name in (("ours", "Trainer") if k % 2 else ("Trainer", "ours"))}
        for name, seconds in times.items():
            total[name] += seconds
        ratio = times["Trainer"] / times["ours"]
        print(f"{batch.real_tokens:>7} {side['positions']:>7} {times['ours']:>7.2f} "
              f"{times['Trainer']:>9.2f} {ratio:>5.2f}x")  # fmt: skip
    print(f"\ntotal: ours {total['ours']:.1f} s, the Trainer's model {total['Trainer']:.1f} s: "
          f"{total['Trainer'] / total['ours']:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
