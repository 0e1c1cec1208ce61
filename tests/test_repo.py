import re
import subprocess
import sys

import pytest

import gpt_ft
from tests.background import Command
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


HEAVY = ("torch", "lightning", "transformers", "jsonargparse", "datasets")
HELP_IMPORTS = (
    "import runpy, sys; sys.argv = ['gpt-ft', '--help']; runpy.run_module('gpt_ft', run_name='__main__'); "
    f"print([name for name in {HEAVY!r} if name in sys.modules])"
)


def start_version(root):
    return [gpt_ft_command("--version", fresh=True), Command([sys.executable, "-c", HELP_IMPORTS])]


@pytest.mark.background(start=start_version)
def test_module_entry_point_reports_version(background):
    """`python -m gpt_ft --version`, in a process of its own; `gpt-ft --help` lists the commands
    without importing torch or any other heavy package (each command imports what it uses)."""
    version, help = background.runs
    assert version.returncode == 0, version.stderr[-2000:]
    assert version.stdout.strip() == f"gpt-ft {gpt_ft.__version__}"
    assert help.returncode == 0, help.stderr[-2000:]
    assert "  fit        train" in help.stdout and help.stdout.splitlines()[-1] == "[]"


def test_a_source_tree_not_installed_still_imports():
    """A copy of the tree on the path without pip's metadata (a machine the tree was copied to):
    `import gpt_ft` works, its version unknown."""
    script = (
        "import importlib.metadata as m; installed = m.version\n"
        "def version(name):\n"
        "    if name == 'gpt_ft':\n"
        "        raise m.PackageNotFoundError(name)\n"
        "    return installed(name)\n"
        "m.version = version\n"
        "import gpt_ft; print(gpt_ft.__version__)"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "0+unknown\n"), done.stderr[-2000:]


def test_the_public_names_are_listed_before_their_first_use():
    """`dir(gpt_ft)` (tab completion) lists them though each is imported on first use only."""
    assert {"GPT", "GPTConfig", "Classifier", "Encoder", "__version__"} <= set(dir(gpt_ft))
