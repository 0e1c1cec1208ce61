"""README.md and docs/ stay true: every repository path they name exists, every link between pages
resolves (anchors included), the README stays a short guide, and the `gpt-ft` command lines they
show can be collected (`shown_commands`) for checking against the parser."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.background import Command
from tests.helpers import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP_FOLDERS = ("configs", "tasks", "benchmarks", "gpt_ft", "tests", "examples", "docs")
# A repository path: one of the top folders, not preceded by anything that makes it part of a
# longer path (`~/tasks/...`, `runs/tests/...`) or of a link (`../gpt_ft/...`, checked as a link).
REPO_PATH = re.compile(rf"(?<![\w./~$-])(?:{'|'.join(TOP_FOLDERS)})/[\w./*-]*")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
BASH_BLOCK = re.compile(r"^```(?:bash|sh)\n(.*?)^```", re.S | re.M)
# Files a reader writes: the pages show them as examples of the reader's own.
PLACEHOLDER = re.compile(r"(^|/)my[_-]")


def text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def named_paths(page: Path) -> list[str]:
    """Every repository path a page names, in code, code blocks, links or prose."""
    found = (m.group(0).rstrip(".,:;") for m in REPO_PATH.finditer(text(page)))
    return sorted({p for p in found if not PLACEHOLDER.search(p)})


def exists(path: str) -> bool:
    return any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but `-` and `_` dropped, spaces to
    hyphens, links and code marks reduced to their text."""
    heading = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    body = re.sub(r"^```.*?^```", "", text(page), flags=re.S | re.M)  # no headings inside code
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", body, re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def shown_commands() -> list[list[str]]:
    """Every `gpt-ft` command line shown in a bash block of README.md or docs/, as its arguments
    after `gpt-ft` (`["fit", "--config", "configs/quickstart.yaml"]`): backslash continuations
    joined, comments dropped, quotes resolved as the shell would."""
    commands = []
    for page in PAGES:
        for block in BASH_BLOCK.findall(text(page)):
            for line in block.replace("\\\n", " ").splitlines():
                argv = shlex.split(line, comments=True)
                if argv[:1] == ["gpt-ft"]:
                    commands.append(argv[1:])
    return commands


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_a_page_names_exists(page):
    missing = [path for path in named_paths(page) if not exists(path)]
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_resolves(page):
    broken = []
    for target in LINK.findall(text(page)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(target)
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
            broken.append(target)
    assert not broken, f"{page.name} has links that do not resolve: {broken}"


def test_readme_is_a_short_guide_with_the_setup_and_the_quickstart():
    readme = text(ROOT / "README.md")
    assert len(readme.splitlines()) <= 300
    for command in (
        "python -m venv .venv && . .venv/bin/activate",
        'pip install -e ".[test]"',
        "python -m pytest -q",
        "gpt-ft fit --config configs/quickstart.yaml",
    ):
        assert command in readme, f"README.md lost {command!r}"


def test_every_docs_page_is_linked_from_the_readme():
    readme = text(ROOT / "README.md")
    unlinked = [p.name for p in PAGES[1:] if f"(docs/{p.name})" not in readme]
    assert not unlinked, f"README.md links no page {unlinked}"


def test_the_package_map_names_every_module():
    """The README's map of the package lists every module by its file name."""
    readme = text(ROOT / "README.md")
    layout = re.search(r"^```text\n(gpt_ft/.*?)^```", readme, re.S | re.M)
    assert layout, "README.md has no map of the package (a text block starting with gpt_ft/)"
    names = set(re.findall(r"[\w.]+\.py", layout.group(1)))
    modules = [
        p.relative_to(ROOT).as_posix()
        for p in sorted((ROOT / "gpt_ft").rglob("*.py"))
        if p.name not in ("__init__.py", "__main__.py") and p.name not in names
    ]
    assert not modules, f"README.md's package map lacks {modules}"


def test_shown_commands_include_the_quickstart():
    commands = shown_commands()
    assert ["fit", "--config", "configs/quickstart.yaml"] in commands
    assert all(argv and not argv[0].startswith("#") for argv in commands)
    assert any("\\" not in " ".join(argv) and len(argv) > 8 for argv in commands)  # continuations joined


def print_config(argv: list[str]) -> list[str]:
    """`argv` asking the parser to show what it parsed and stop (before a suite's `--`)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    return [*argv[:cut], "--print_config", *argv[cut:]]


PARSE_SHOWN = """
import contextlib, io, json, shlex, sys
from gpt_ft.cli import main
from tests.test_docs import PLACEHOLDER, print_config, shown_commands

shown = [argv for argv in shown_commands() if not any(PLACEHOLDER.search(a) for a in argv)]
broken = []
for argv in shown:
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            main(print_config(argv))
        code = 0
    except SystemExit as stop:
        code = stop.code
    if code != 0:
        broken.append(f"gpt-ft {shlex.join(argv)}: {err.getvalue().strip()[-300:]}")
print(json.dumps({"shown": len(shown), "broken": broken}))
"""


def start_shown_commands(root):
    return [Command([sys.executable, "-c", PARSE_SHOWN], ROOT, preloaded=True)]  # the pages' paths


@pytest.mark.background(start=start_shown_commands)
def test_every_shown_command_parses(background):
    """Each `gpt-ft` line of README.md and docs/ goes through its command's parser as shown (with
    `--print_config`, so nothing runs), from the repository root: command names, options and values
    the parser accepts, and the repository files they name (configs, cards) read. Lines naming the
    reader's own files (`my_...`) are left out."""
    (out,) = background.runs
    assert out.returncode == 0, out.stderr[-3000:]
    parsed = json.loads(out.stdout.strip().splitlines()[-1])
    assert parsed["shown"] >= 20
    assert not parsed["broken"], "\n".join(parsed["broken"])
