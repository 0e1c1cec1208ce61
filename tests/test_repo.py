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
    "import contextlib, runpy, sys; sys.argv = ['gpt-ft', '--help']\n"
    "with contextlib.suppress(SystemExit): runpy.run_module('gpt_ft', run_name='__main__')\n"  # (exit code 0)
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


def test_python_dash_m_names_the_program_gpt_ft_in_a_classs_help(monkeypatch, capsys):
    """`python -m gpt_ft fit --data.help TaskDataModule` printed "usage: __main__.py"."""
    import runpy

    monkeypatch.setattr(
        sys, "argv", [str(ROOT / "gpt_ft" / "__main__.py"), "fit", "--data.help", "TaskDataModule"]
    )
    with pytest.raises(SystemExit):
        runpy.run_module("gpt_ft", run_name="__main__")
    assert capsys.readouterr().out.startswith("usage: gpt-ft ")


READ_ONLY_COMMANDS = "generation", "export", "labelling", "encoder", "calibration"
HEAVY_FOR_READING = ("lightning", "torchmetrics", "scipy", "matplotlib", "torch._dynamo")
READ_ONLY_IMPORTS = f"""import sys
for name in {READ_ONLY_COMMANDS!r}:
    __import__("gpt_ft.eval." + name)
print([name for name in {HEAVY_FOR_READING!r} if name in sys.modules])
from gpt_ft.cli import main
main(["generate", "--ckpt_path", sys.argv[1], "--tokenizer", sys.argv[2], "--prompt", "the cat",
      "--max_new_tokens", "3", "--device", "cpu"])
print([name for name in {HEAVY_FOR_READING!r} if name in sys.modules])
"""


def start_read_only_commands(root, tokenizer_dir):
    from transformers import GPT2Config, GPT2LMHeadModel

    from gpt_ft.data.tokenizer import load_tokenizer

    config = GPT2Config(
        n_layer=1, n_embd=16, n_head=2, n_positions=32, vocab_size=len(load_tokenizer(tokenizer_dir))
    )
    GPT2LMHeadModel(config).save_pretrained(root / "model")
    return [Command([sys.executable, "-c", READ_ONLY_IMPORTS, str(root / "model"), tokenizer_dir])]


@pytest.mark.background(start=start_read_only_commands)
def test_commands_that_only_read_a_model_start_without_the_training_stack(background):
    """The modules of `gpt-ft generate`, `export`, `label`, `embed` and `calibrate` import neither
    Lightning nor torchmetrics (with scipy and matplotlib) nor TorchDynamo (`generate --help`: 1.8 s,
    not 6.6), and `generate` decodes a prompt of a transformers folder without any of them."""
    (run,) = background.runs
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0] == lines[-1] == "[]", run.stdout


QUIET_TORCHAO = """import importlib.util, logging, sys
from gpt_ft import GPT, GPTConfig
GPT(GPTConfig.from_name("llama-micro", vocab_size=64)).to_hf()
print(importlib.util.find_spec("torchao") is not None, "torchao" in sys.modules)
print(logging.getLogger("torchao").level, logging.getLogger("torch.utils._pytree").level)
"""


def start_quiet_torchao(root):
    return [Command([sys.executable, "-c", QUIET_TORCHAO])]


@pytest.mark.background(start=start_quiet_torchao)
def test_a_transformers_model_made_from_python_logs_nothing_of_torchaos_import(background):
    """transformers imports torchao where it is installed (the quantize extra), and torchao's import
    logs about CUDA kernels a CPU-only torch cannot load and enums torch's pytree now supports: not
    where `to_hf` (or a GGUF file's reading, an export) makes the first transformers model, and the
    loggers' levels are as they were."""
    (run,) = background.runs
    assert run.returncode == 0, run.stderr[-3000:]
    installed, imported = run.stdout.splitlines()[0].split()
    assert installed == imported  # where torchao is installed, this run imported it
    assert run.stdout.splitlines()[1] == "0 0"
    assert not [line for line in run.stderr.splitlines() if "torchao" in line or "_pytree" in line]


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
