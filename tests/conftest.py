import pytest

from gpt_ft.data.tokenizer import train_tokenizer

CORPUS = """The quick brown fox jumps over the lazy dog. A man is playing a guitar.
It is a charming and often affecting journey. Weapons of mass destruction were not found.
She decides to bake a batch of brownies for the party. He is happy now. He joined a gang.
Is it true? Yes, it is. No, it is not. The cat sat on the mat. Two dogs run in a park.
"""


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """A small byte-level BPE tokenizer (with the GPT-1 special tokens), trained once per session."""
    root = tmp_path_factory.mktemp("tokenizer")
    corpus = root / "corpus.txt"
    corpus.write_text(CORPUS * 20)
    out = root / "tok"
    train_tokenizer([corpus], vocab_size=400, out_dir=out, show_progress=False)
    return str(out)
