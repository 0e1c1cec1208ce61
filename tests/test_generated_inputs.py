"""Error paths tried by generated inputs (tests/generated.py): malformed task files in every format,
a bad label at a known line, malformed cards and fit configs. Each ends in success, or in exit
code 2 and one sentence naming the file (and the line); never a traceback; nothing on disk changed.

A fixed seed and a bounded number of inputs here (sized to the suite's time: each input runs a
command); `python -m tests.generated --examples 10000` draws many more at random.
"""

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings

from tests.generated import CHECKS, quiet

EXAMPLES = {"task files": 14, "one bad row": 9, "preference files": 8, "cards": 18, "configs": 6}


@pytest.fixture(scope="module", autouse=True)
def _quiet():
    quiet()


@pytest.mark.parametrize("kind", list(EXAMPLES))
def test_generated_inputs_end_in_success_or_one_sentence(kind, tokenizer_dir, tmp_path_factory, monkeypatch):
    import datasets

    # The datasets cache of these one-off files stays in this test's folder.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("cache")))
    strategy, check = CHECKS[kind]

    @seed(20261125)
    @settings(
        max_examples=EXAMPLES[kind],
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(strategy)
    def holds(value):
        with tempfile.TemporaryDirectory() as tmp:
            problem = check(Path(tmp), tokenizer_dir, value)
        assert problem is None, problem

    holds()
