import re

import pytest

import gpt_ft
from tests.background import gpt_ft as gpt_ft_command
from tests.helpers import ROOT


def readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Run the tests\s+```bash\n(.+?)\n```", readme, re.S)
    assert block, "README has no 'Run the tests' command block"
    return block.group(1).strip()


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1].strip() == readme_test_command()


def start_version(root):
    return [gpt_ft_command("--version")]


@pytest.mark.background(start=start_version)
def test_module_entry_point_reports_version(background):
    """`python -m gpt_ft --version`, in a process of its own."""
    (out,) = background.runs
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == f"gpt-ft {gpt_ft.__version__}"
