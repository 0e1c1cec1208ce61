import re
import subprocess
import sys
from pathlib import Path

import gpt_ft

ROOT = Path(__file__).resolve().parents[1]


def readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Run the tests\s+```bash\n(.+?)\n```", readme, re.S)
    assert block, "README has no 'Run the tests' command block"
    return block.group(1).strip()


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1].strip() == readme_test_command()


def test_module_entry_point_reports_version():
    cmd = [sys.executable, "-m", "gpt_ft", "--version"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"gpt-ft {gpt_ft.__version__}"
