"""Error paths tried by generated inputs (tests/generated.py): malformed task files in every format,
a bad label at a known line, malformed cards and fit configs. Each ends in success, or in exit
code 2 and one sentence naming the file (and the line); never a traceback; nothing on disk changed.

A fixed seed and a bounded number of inputs here (sized to the suite's time: each input runs a
command), drawn and checked in a background process of their own (tests/background.py);
`python -m tests.generated --examples 10000` draws many more at random.
"""

import json
import re
import sys

import pytest

from tests.background import Command

EXAMPLES = {"task files": 7, "one bad row": 5, "preference files": 4, "cards": 9, "configs": 3}
SEED = 20261125

DRAW = """
import json, sys
import datasets
from tests.generated import quiet, run_many
datasets.config.HF_DATASETS_CACHE = sys.argv[1]  # these one-off files' cache stays in the test's folder
quiet()
for kind, examples in json.loads(sys.argv[3]).items():
    tried, failed = run_many(kind, sys.argv[2], examples, seed=int(sys.argv[4]))
    print(f"{kind}: {tried} tried, {len(failed)} failed", flush=True)
"""


def start_generated(root, tokenizer_dir):
    args = [str(root / "cache"), tokenizer_dir, json.dumps(EXAMPLES), str(SEED)]
    return [Command([sys.executable, "-c", DRAW, *args], root, preloaded=True)]


@pytest.mark.background(start=start_generated)
@pytest.mark.parametrize("kind", list(EXAMPLES))
def test_generated_inputs_end_in_success_or_one_sentence(kind, background):
    (out,) = background.runs
    counted = re.search(rf"^{kind}: (\d+) tried, (\d+) failed$", out.stdout, re.M)
    assert counted, out.stdout[-3000:] + out.stderr[-3000:]
    failures = re.findall(rf"^{kind}: .*\n  .*", out.stdout, re.M)  # each input, then its problem
    assert int(counted[2]) == 0, "\n".join(failures)
    assert int(counted[1]) >= min(EXAMPLES[kind], 5)  # drawn, not all rejected
