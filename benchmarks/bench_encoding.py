"""Encoding throughput of TaskDataModule (examples/s) and peak memory, 1 process vs `num_proc` processes.

Each setting runs in a fresh child process with an empty datasets cache, so nothing is read back
from an earlier run; the child reports examples/s and its peak RSS (children included).

    python benchmarks/bench_encoding.py --glue GLUE_DIR \\
        --tokenizer OPENAI_GPT_DIR
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time

from paths import existing


def child(args) -> None:
    import datasets

    from gpt_ft.adapters import LocalFiles, SingleText
    from gpt_ft.data.task_data import TaskDataModule

    datasets.disable_progress_bars()
    task = SingleText(
        name="sst2", labels=["negative", "positive"], local=LocalFiles(splits={"train": "SST-2/train.tsv"})
    )
    dm = TaskDataModule(
        task, args.tokenizer, data_dir=args.glue, num_proc=args.num_proc if args.num_proc > 1 else None
    )
    start = time.perf_counter()
    ds = dm.encoded("train", labelled=True)
    seconds = time.perf_counter() - start
    peak_kb = (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    )
    print(json.dumps({"examples": len(ds), "seconds": seconds, "peak_mb": peak_kb / 1024}))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--glue", type=existing, required=True, help="folder holding SST-2/train.tsv")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--num-proc", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    print("SST-2 train, load + encode (reading included), fresh cache each run; peak = main + largest worker")
    print(f"{'processes':>9} {'examples':>9} {'seconds':>8} {'examples/s':>11} {'peak MiB':>9}")
    for n in args.procs:
        with tempfile.TemporaryDirectory() as cache:
            cmd = [sys.executable, __file__, "--child", "--glue", args.glue, "--tokenizer", args.tokenizer]
            env = {**__import__("os").environ, "HF_DATASETS_CACHE": cache}
            out = subprocess.run(cmd + ["--num-proc", str(n)], capture_output=True, text=True, env=env)
        if out.returncode:  # the child's own last words, not a CalledProcessError's traceback
            sys.exit(f"bench_encoding.py: {(out.stderr.strip().splitlines() or ['failed'])[-1]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rate = r["examples"] / r["seconds"]
        print(f"{n:>9} {r['examples']:>9} {r['seconds']:>8.2f} {rate:>11.0f} {r['peak_mb']:>9.0f}")


if __name__ == "__main__":
    main()
