"""The package's layout: layers whose imports point one way, files short enough to read, and no
branching on input shapes outside the adapters."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpt_ft"
# Lower layers never import higher ones; `errors` is shared by all.
LAYERS = {"errors": 0, "model": 1, "adapters": 1, "data": 2, "training": 3, "eval": 4, "cli": 5}
SHAPES = "MultipleChoice|Similarity|TextPair|SingleText|MultiLabel"


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py"))


def layer(path: Path) -> str | None:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0] if parts[0] in LAYERS else None


def gpt_ft_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every gpt_ft import, function-level ones included, TYPE_CHECKING ones not."""
    tree = ast.parse(path.read_text())
    type_checking = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_checking |= {id(n) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpt_ft"):
            names = (
                [f"{node.module}.{a.name}" for a in node.names] if node.module == "gpt_ft" else [node.module]
            )
            found += [(node.lineno, name) for name in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("gpt_ft")]
    return found


def test_the_layers_exist_and_every_module_is_in_one():
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        "model", "adapters", "data", "training", "eval", "cli"
    }  # fmt: skip
    loose = {p.name for p in PACKAGE.glob("*.py")}
    assert loose == {"__init__.py", "__main__.py", "errors.py"}


def test_imports_point_down_the_layers():
    wrong = []
    for path in modules():
        own = layer(path)
        if own is None:
            continue
        for line, name in gpt_ft_imports(path):
            target = name.split(".")[1] if "." in name else None
            if target not in LAYERS:
                continue
            if LAYERS[target] > LAYERS[own] or (LAYERS[target] == LAYERS[own] and target != own):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert wrong == []


def test_no_import_cycles_between_modules():
    graph = {}
    for path in modules():
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        graph[name] = {m for _, m in gpt_ft_imports(path)}
    # The model's facade (GPT.from_hf / from_pretrained / to_hf) imports the converter lazily.
    graph["gpt_ft.model.gpt"] -= {"gpt_ft.model.hf"}

    def resolve(name: str) -> str | None:
        while name and name not in graph:
            name = name.rpartition(".")[0]
        return name or None

    edges = {m: {resolve(t) for t in targets} - {None, m} for m, targets in graph.items()}
    # A package's __init__ re-exports its modules: an edge into a package means its modules.
    for m in list(edges):
        edges[m] = {t for t in edges[m] if not m.startswith(t + ".")}
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for t in edges[m]:
            if state.get(t) == 1:
                pytest.fail("import cycle: " + " -> ".join([*trail[trail.index(t) :], t]))
            if t not in state:
                visit(t, [*trail, t])
        state[m] = 2

    for m in edges:
        if m not in state:
            visit(m, [m])


def test_files_stay_readable():
    long = {str(p.relative_to(ROOT)): n for p in modules() if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}
    source = (PACKAGE / "training" / "module.py").read_text()
    body = re.search(r"^class GPTModule.*?(?=^\S)", source, re.S | re.M).group(0)
    assert len(body.splitlines()) < 250


def test_nothing_outside_the_adapters_branches_on_an_input_shape():
    pattern = re.compile(rf"head_kind|isinstance\([^)]*({SHAPES})")
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in modules()
        if layer(p) != "adapters"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []
