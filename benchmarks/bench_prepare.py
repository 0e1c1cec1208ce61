"""`gpt-ft prepare` throughput (tokens/s) and peak memory, 1 vs 2 workers, and on a corpus larger than 1 GB.

Each run is a fresh process (tokenizing threads run inside it); peak memory is its largest
resident set (getrusage), which includes the interpreter and the imported libraries.

    python benchmarks/bench_prepare.py --corpus BOOKS_DIR \\
        --tokenizer GPT2_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from paths import existing


def run_prepare(inputs: list[str], tokenizer: str, workers: int, workdir: Path) -> dict:
    out = workdir / f"tokens-{workers}-{time.monotonic_ns()}"
    code = (
        "import json, resource, sys\n"
        "from gpt_ft.data.prepare import prepare\n"
        f"meta = prepare(out_dir={str(out)!r}, tokenizer={tokenizer!r}, inputs={inputs!r},\n"
        f"               workers={workers}, progress=False)\n"
        "self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(json.dumps({**meta, 'peak_mb': self_kb / 1024}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if result.returncode:  # the child's own last words, not a CalledProcessError's traceback
        sys.exit(f"bench_prepare.py: {(result.stderr.strip().splitlines() or ['failed'])[-1]}")
    meta = json.loads(result.stdout.strip().splitlines()[-1])
    for f in out.iterdir():
        if f.is_file():
            f.unlink()
    return meta


def report(label: str, meta: dict) -> None:
    tokens = meta["tokens"]["train"] + meta["tokens"]["validation"]
    print(
        f"{label:<28} {tokens / 1e6:>9.1f}M {meta['seconds']:>8.1f} {tokens / meta['seconds'] / 1e6:>8.2f}M "
        f"{meta['peak_mb']:>8.0f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=existing, required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--big-gb", type=float, default=1.05, help="size of the generated corpus; 0 skips it")
    args = parser.parse_args()
    print(f"{'run':<28} {'tokens':>10} {'seconds':>8} {'tok/s':>9} {'peak MB':>8}")
    with tempfile.TemporaryDirectory() as tmp:  # the system's temporary folder, never the repository
        work = Path(tmp)
        for n in args.workers:
            report(
                f"{Path(args.corpus).name}, {n} worker(s)",
                run_prepare([args.corpus], args.tokenizer, n, work),
            )
        if args.big_gb > 0:
            texts = sorted(Path(args.corpus).rglob("*.txt"))
            big = work / "big"
            big.mkdir()
            written, i = 0, 0
            target = int(args.big_gb * 2**30)
            while written < target:  # books copied round-robin into 64 MB files
                with (big / f"part{i:03d}.txt").open("w") as f:
                    size = 0
                    while size < 64 * 2**20 and written + size < target:
                        text = texts[(i * 7 + size) % len(texts)].read_text(errors="replace")
                        f.write(text)
                        size += len(text.encode())
                written += size
                i += 1
            report(
                f"generated {written / 2**30:.2f} GB, {max(args.workers)} workers",
                run_prepare([str(big)], args.tokenizer, max(args.workers), work),
            )
    print(f"(machine: {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
