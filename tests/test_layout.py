"""The package's layout: layers whose imports point one way, files short enough to read, and no
branching on input shapes outside the adapters."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpt_ft"
# Lower layers never import higher ones; `errors` and `workarounds` (other libraries' private APIs)
# are shared by all. The package's root (its `__init__` and `__main__`: the public face and the
# console script) stands above every layer.
LAYERS = {
    "errors": 0, "workarounds": 0, "model": 1, "adapters": 1, "weights": 2, "data": 3, "training": 4,
    "eval": 5, "cli": 6, "gpt_ft": 7,
}  # fmt: skip
SHAPES = "MultipleChoice|Similarity|TextPair|SingleText|MultiLabel"
# ... nor on an output kind (the adapter's `output` decides), nor on the card's `regression` flag.
KINDS = "ClassificationOutput|RegressionOutput|ChoiceOutput|MultiLabelOutput|TaskOutput"


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py"))


def layer(path: Path) -> str:
    """The layer of a module: its folder's, or for the root's files `errors` or the root itself."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts in {("__init__",), ("__main__",)}:
        return "gpt_ft"
    return parts[0]


def target(name: str) -> str:
    """The layer an imported name lives in: `gpt_ft.data.x` in data, `gpt_ft` and its attributes
    (`from gpt_ft import GPT`) in the root."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "gpt_ft"


def is_module(name: str) -> bool:
    """Whether the dotted `name` is a module or package of gpt_ft (not a name inside one)."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def gpt_ft_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every gpt_ft import: at the top, inside functions and under TYPE_CHECKING
    (a circle that only type checkers walk is a circle still)."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpt_ft"):
            # `from gpt_ft.weights import hf` imports the module gpt_ft.weights.hf
            names = [
                f"{node.module}.{a.name}"
                if node.module == "gpt_ft" or is_module(f"{node.module}.{a.name}")
                else node.module
                for a in node.names
            ]
            found += [(node.lineno, name) for name in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("gpt_ft")]
    return found


def test_the_layers_exist_and_every_module_is_in_one():
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        "model", "weights", "adapters", "data", "training", "eval", "cli", "workarounds", "errors"
    }  # fmt: skip
    loose = {p.name for p in PACKAGE.glob("*.py")}
    assert loose == {"__init__.py", "__main__.py"}


def test_every_module_is_in_a_layer():
    assert {str(p.relative_to(ROOT)) for p in modules() if layer(p) not in LAYERS} == set()


def test_imports_point_down_the_layers():
    wrong = []
    for path in modules():
        own = layer(path)
        for line, name in gpt_ft_imports(path):
            theirs = target(name)
            if LAYERS[theirs] > LAYERS[own] or (LAYERS[theirs] == LAYERS[own] and theirs != own):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert wrong == []


def test_no_module_below_the_root_uses_it():
    """The root is the public face: below it, a module imports what it needs from its own layer or
    a lower one (the version from the package's metadata), never `gpt_ft` itself."""
    wrong = []
    for path in modules():
        if layer(path) == "gpt_ft":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            uses_root = (
                (isinstance(node, ast.Import) and any(a.name == "gpt_ft" for a in node.names))
                or (isinstance(node, ast.ImportFrom) and node.module == "gpt_ft")
                or (  # `gpt_ft.X` after `import gpt_ft.data.files`, X not a layer
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "gpt_ft"
                    and node.attr not in LAYERS
                )
            )
            if uses_root:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert wrong == []


def test_no_import_cycles_between_modules():
    graph = {}
    for path in modules():
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        graph[name] = {m for _, m in gpt_ft_imports(path)}

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
    body = re.search(r"^class GPTModule.*?(?=^\S|\Z)", source, re.S | re.M).group(0)
    assert len(body.splitlines()) < 250


def test_text_files_are_read_and_written_as_utf8_whatever_the_locale():
    """A text file opened without an encoding is read in the locale's (Windows' cp1252, a Latin-1
    locale): a card's non-English labels, a run's config.yaml or an exported config.json failed
    there, or were written otherwise than they are read back."""
    unnamed = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute | ast.Name):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            given = {k.arg for k in node.keywords}
            positional = {
                "read_text": 0,
                "write_text": 1,
                "open": 1 if isinstance(node.func, ast.Name) else 0,
            }
            if name not in positional or "encoding" in given:
                continue
            if name == "open":  # (a method's mode is its first argument, the builtin's its second)
                if isinstance(node.func, ast.Attribute) and getattr(node.func.value, "id", "") in (
                    "os",
                    "gzip",
                ):
                    continue
                mode = node.args[positional[name]] if len(node.args) > positional[name] else None
                mode = mode or next((k.value for k in node.keywords if k.arg == "mode"), None)
                if isinstance(mode, ast.Constant) and "b" in mode.value:
                    continue
            elif name == "read_text" and node.args or name == "write_text" and len(node.args) > 1:
                continue  # (the encoding given by position)
            unnamed.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert unnamed == []


def test_nothing_outside_the_adapters_branches_on_an_input_shape():
    pattern = re.compile(rf"head_kind|isinstance\([^)]*({SHAPES}|{KINDS})|\.regression\b")
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in modules()
        if layer(p) != "adapters"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []


PRIVATE = re.compile(r"_[a-z]\w*")


def private_names(node: ast.AST, own: set[str], classes: set[str]) -> list[str]:
    """Other libraries' private names `node` uses: `x._name` (x not the package's own object), `from
    lib import _name`, `import lib._module`, a string `"_name"` or `"lib._module"`."""
    if isinstance(node, ast.Attribute) and PRIVATE.fullmatch(node.attr):
        receiver = node.value.id if isinstance(node.value, ast.Name) else None
        return [] if receiver in {"self", "cls", *classes} and node.attr in own else [node.attr]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and not node.module.startswith("gpt_ft"):
        return [n for n in [a.name for a in node.names] + node.module.split(".") if PRIVATE.fullmatch(n)]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if any(map(PRIVATE.fullmatch, a.name.split(".")))]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
        if (PRIVATE.fullmatch(text) and text not in own) or re.fullmatch(r"[\w.]*\._[a-z][\w.]*", text):
            return [text]
    return []


def overridden_private_methods(node: ast.AST, referenced: set[str], classes: set[str]) -> list[str]:
    """The `_methods` a class with another library's base defines and the package never calls:
    overrides of that library's private methods."""
    if not isinstance(node, ast.ClassDef):
        return []
    if all(isinstance(base, ast.Name) and base.id in classes for base in node.bases):
        return []
    return [
        f"{node.name}.{item.name}"
        for item in node.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
        and PRIVATE.fullmatch(item.name)
        and item.name not in referenced
    ]


def test_other_libraries_private_apis_are_used_in_workarounds_only():
    """Another library's private API appears in gpt_ft/workarounds/ only, behind a named function
    whose comment names the upstream issue."""
    trees = {path: ast.parse(path.read_text()) for path in modules()}
    own, classes, referenced = set(), set(), set()  # the package's own names; the attributes it reads
    for node in (node for tree in trees.values() for node in ast.walk(tree)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
            if isinstance(node, ast.ClassDef):
                classes.add(node.name)
        elif isinstance(node, ast.Attribute):
            (own if isinstance(node.ctx, ast.Store) else referenced).add(node.attr)
    found = []
    for path, tree in trees.items():
        if path.parent.name == "workarounds":
            continue
        nodes = list(ast.walk(tree))
        fstring_parts = {id(n) for node in nodes if isinstance(node, ast.JoinedStr) for n in node.values}
        for node in (node for node in nodes if id(node) not in fstring_parts):  # f"{t}_token_id": no API
            names = private_names(node, own, classes) + overridden_private_methods(node, referenced, classes)
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names]
    assert found == []


OUTPUT_KINDS = {"classification", "multiple-choice", "regression", "multi-label", "preference"}
FAMILIES = {"openai-gpt", "gpt2", "llama", "qwen2", "qwen3", "mistral", "phi3", "gemma3_text"}


def string_comparisons(path: Path) -> list[tuple[int, set[str], str]]:
    """(line, strings, source) of each comparison in `path` with string constants on a side."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            strings = {
                c.value
                for side in [node.left, *node.comparators]
                for c in ast.walk(side)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            }
            found.append((node.lineno, strings, ast.unparse(node)))
    return found


def test_output_kinds_and_model_families_are_compared_in_their_own_places_only():
    """What an output kind means (its head, loss, metrics, export) is the kind's, in the adapters;
    a model family's specifics are the conversions', in the weights floor: nowhere else compares
    a kind (`.kind`, its name) or a family (`model_type`, its name) as a string."""
    wrong = []
    for path in modules():
        own = layer(path)
        for line, strings, source in string_comparisons(path):
            if "problem_type" in source:  # transformers' own field, in a class that runs without gpt_ft
                continue
            kind = own != "adapters" and (strings & OUTPUT_KINDS or (".kind" in source and strings))
            family = own not in ("adapters", "weights") and (strings & FAMILIES or "model_type" in source)
            if kind or family:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {source}")
    assert wrong == []


def test_the_command_line_is_small_and_reads_its_arguments_only_through_parsers():
    """gpt_ft/cli/ stays about 500 lines, and nothing in it or in the run's LightningCLI walks,
    looks ahead in or rewrites the arguments: jsonargparse reads them (main only takes the first
    word, the command's name, off the front)."""
    files = [*sorted((PACKAGE / "cli").glob("*.py")), PACKAGE / "training" / "runs.py"]
    assert sum(len(p.read_text().splitlines()) for p in files[:-1]) <= 500
    walks = re.compile(
        r"for .* in (enumerate\()?(sys\.)?(argv|args)\b"  # walks the arguments
        r"|(argv|args)\[i\b|\.insert\(|(argv|args)\.(append|remove)"  # looks ahead, or rewrites them
    )
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in files
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if walks.search(line)
    ]
    assert found == []
