"""The parsers' reports in one sentence: jsonargparse's nested report of a bad argument, and YAML's
(a file that does not parse, a key given twice)."""

from __future__ import annotations

import ast
import errno
import os
import re
from pathlib import Path


def parse_error_message(text: str, hidden: str | None = None) -> str:
    """jsonargparse's nested report of a bad argument as one sentence: the argument and the reason
    (`hidden`: one its report leaves out, `untyped_parameter`'s)."""
    keys = list(dict.fromkeys(re.findall(r'Parser key "([^"]+)"', text)))
    lines = [line.strip(" -") for line in text.splitlines()]
    lines = [line for line in lines if line and not inline(line)]
    values = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Given value:")]
    nested = re.search(r"NestedArg\(key='([^']*)', val=('[^']*'|\"[^\"]*\")\)", text)  # the value's repr
    nested = nested and (nested[0], nested[1], nested[2][1:-1])  # a path with ' in it: in "quotes"
    in_mapping = card_in_mapping(values[-1]) if values and not nested and "task" in keys else None
    card = nested[2] if nested and nested[1] == "task" else in_mapping
    value = nested[2] if nested else card or (values[0] if values else None)  # as typed: a file, or the value
    typed = Path(card).expanduser() if card else None
    if typed is not None and (
        typed.is_dir() or typed.is_file() and typed.suffix not in (".yaml", ".yml", ".json")
    ):
        what = "a folder" if typed.is_dir() else "not a YAML file"
        return f"--data.task {value} is {what}: give a task card (e.g. tasks/glue/rte.yaml)."
    given = values[0] if values else value  # the innermost value, the one at fault
    where = [key for i, key in enumerate(keys) if not any(k.startswith(f"{key}.") for k in keys[i + 1 :])]
    where = f"--{'.'.join(where)}: " if where else ""  # keys relative (data, task) or whole (model.lr)
    expected = [line for line in lines if line.startswith("Expected a ") and "NoneType" not in line]
    first = lines.index(expected[0]) if expected else len(lines)  # a bad value: a class refusing the
    unaccepted = [line for line in lines[:first] if "is not accepted" in line or "is not expected" in line]
    bad_class = [  # option after it (a union's base class) is not the fault
        f"{line.removeprefix('Problem with given ').rstrip(':')}: {lines[i + 1]}"
        for i, line in enumerate(lines[: first - 1])
        if line.startswith("Problem with given class_path") and not lines[i + 1].startswith("Parser key")
    ]
    not_a_class = [said.format(*m.groups()) for pattern, said in (
        (r"Import path (\S+) does not correspond to a subclass of (\w+)",
         "class_path {0!r} is not a subclass of {1}"),
        (r"Expected a dot import path string: (\S*)",
         "class_path {0!r} is not an import path (module.Class)"),
        (r"Multiple subclasses with name (\w+)\. Give the full class path[^:]*: (.+?)\.?$",  # (EarlyStopping)
         "{0} names several classes: give one's full path ({1})"),
    ) for m in re.finditer(pattern, text, re.M)]  # fmt: skip
    no_subclass = re.search(r"Not a valid subclass of (\w+)", text)
    built = re.search(r"^Given value: .*?Namespace\(class_path='([\w.]+)'", text, re.M)  # (one, or a list's)
    errs = lines[lines.index("Errors:") + 1 : first] if built and "Errors:" in lines else []
    noise = (
        "Given value",
        "Subtypes:",
        "Does not validate",
        "Not a valid subclass",
        "Subclass types",
        "a class path",
        "a dict with",
    )  # fmt: skip  (jsonargparse's words, not the class's)
    raised = [line for line in errs if not line.startswith(noise)]
    if unaccepted:
        reason = unaccepted[0]
    elif not_a_class:
        reason = not_a_class[0]
    elif raised and text.startswith("Does not validate"):  # its arguments (instantiated: a logger's)
        reason = f"{built[1].rsplit('.', 1)[-1]} refused its arguments: {raised[0]}"
    elif no_subclass and (unset := unset_argument(text, where.rstrip(": "))):
        reason = unset
    elif no_subclass:  # neither a class path nor a mapping: a number, a list, ...
        kind = (
            "task card (a file, or class_path and init_args)"
            if no_subclass[1] == "TaskAdapter"
            else (f"{no_subclass[1]} (a class path, or class_path and init_args)")
        )
        reason = f"expected a {kind}, got {given}"
    elif any(line.startswith("Expected a path but") for line in lines):
        reason = yaml_file_problem(value) or unimported(value) or f"{value} {unreadable(value)}"
    elif bad_class:
        reason = bad_class[-1]
    elif expected:  # the innermost union's types as declared, with its literals' values as one list
        subtypes = next((line[11:-1] for line in lines[first::-1] if line.startswith("Subtypes: [")), None)
        types = [e[11:].partition(". Got value:")[0] for e in expected]  # (an empty value: no space after)
        declared = [t for t in re.split(r", (?![^\[]*\])", subtypes or "") if "NoneType" not in t]
        declared = declared if set(types) & set(declared) else types  # else an outer union's
        got = [e.partition(". Got value:")[2].strip() if ". Got" in e else None for e in expected]
        a_list = str(given).startswith("[")  # an item of a list at fault: quoted, or a type not declared
        items = [(t, v) for t, v in zip(types, got) if v and (t not in declared or a_list and v[:1] != "[")]
        kinds = [plain(t) for t in declared]
        values = ", ".join(k[15:-1] for k in kinds if k.startswith("typing.Literal["))
        kinds = [k for k in kinds if "Literal[" not in k[:15]] + [f"one of {values}"] * bool(values)
        shown = got[0] if got[0] is not None and (got[0][:1] == "[" or not a_list) else given
        reason = f"expected {' or '.join(kinds)}, got {shown!r}"
        reason += "".join(f" ({v} is not a{'n' * (plain(t)[0] in 'aeiou')} {plain(t)})" for t, v in items[:1])
        listed = str(shown).startswith("[") or values  # a list given, or a name
        hint = {"list": ": a list is written [a, b, c] (one argument)" * (not listed),
                "dict": ": a mapping is written {key: value} (a space after each colon)"}  # fmt: skip
        reason += hint.get(kinds[0][:4].lower(), "")
    else:
        noise = ("Parser key", "Does not validate", "Subtypes:", "Errors:", "Given value")
        reasons = [line for line in lines if not line.startswith(noise)]
        reason = reasons[0] if reasons else lines[0] if lines else "invalid arguments"
    reason = (hidden or reason).rstrip(".:")
    if re.search(r"\((True|False|[-+\d.e]+) is not a str\)$", reason):  # `[no, yes]`, `[0, 1]` unquoted
        reason += ": YAML reads yes, no, true, false as booleans and digits as numbers: quote each "
        reason += "(\"['no', 'yes']\")"
    if m := re.match(r"the following arguments are required: ([\w., ]+)$", reason):  # as they are typed
        reason = f"the following arguments are required: {', '.join(f'--{n}' for n in m[1].split(', '))}"
    if (m := re.search(r"class_path '(\w+)[\w.]*': No module named '(\w+)'$", reason)) and m[1] == m[2]:
        reason += " (a module of your own is found where PYTHONPATH names its folder)"
    if (
        where == "--data.task: "
        and value
        and not Path(value).expanduser().exists()
        and "/" not in str(given)[:1]
    ):
        if cards := repository_cards(value):  # `sst2`, `glue/sst2.yaml` from another folder
            which = (
                f"card of that name is {cards[0]}"
                if len(cards) == 1
                else f"cards of that name are {', '.join(cards)}"
            )
            reason = f"{value} is no card file here; the repository's {which}"
        elif reason.startswith(f"class_path {value!r} is not an import path"):
            reason = f"{value} is neither a card file nor a class path (module.Class)"
    if (
        where == "--data: " and reason == "Option 'task' is not accepted"
    ):  # a card, to a language model's data
        reason += " (the data module given reads a corpus's token files; a card is a fine-tuning config's)"
    elif value and value.endswith((".yaml", ".yml")) and value not in reason:  # a card or config file
        reason += f" (in {value})"
    if reason.startswith("unrecognized arguments") and re.search(r"--(optimizer|lr_scheduler)\b", reason):
        reason += " (the optimizer and its schedule are the model's: --model.optimizer, --model.lr, ...)"
    hint = {"--model: ": "weights go to --model.init_from", "--data: ": "a task card goes to --data.task"}
    hint = f" ({hint[where]})" if where in hint else ""
    if m := re.match(r"Unable to load config '(.*)'", reason):  # `--model WEIGHTS`, a missing file
        gone = m[1].endswith((".yaml", ".yml", ".json")) and not Path(m[1]).expanduser().exists()
        reason = f"{m[1]} does not exist" if gone else f"{m[1]} is no YAML file of its options{hint}"
    elif re.match(r"class_path 'gpt_ft\.adapters\.\w+' is not a subclass of LightningDataModule", reason):
        reason += hint
    return f"{where}{reason}."


def nearest_option(message: str, options: list[str]) -> str:
    """`message`, where it refuses an option no parser has (`unrecognized arguments: --model.lrr`),
    with the nearest of `options` (the command's)."""
    import difflib

    if m := re.search(r"unrecognized arguments: (--[\w.-]+)", message):
        if close := difflib.get_close_matches(m[1], options, n=1, cutoff=0.8):
            return f"{message.rstrip('.')} (did you mean {close[0]}?)."
    return message


def untyped_parameter(exc: BaseException | None) -> str | None:
    """The parameter without a type hint for which jsonargparse refused a class (a user's adapter:
    a card's values are read by their types), which its outer report leaves out; None if none."""
    pattern = r"Parameter '(\w+)' from '([\w.<>]+)\.__init__' does not specify a type"
    while exc is not None and not (m := re.search(pattern, str(exc))):
        exc = exc.__cause__ or exc.__context__
    return (
        exc
        and f"{m[2]}'s argument {m[1]!r} has no type hint, by which a card's value is read (e.g. list[str])"
    )


def unset_argument(text: str, option: str) -> str | None:
    """A class added to a list (`--trainer.logger+=CSVLogger`) whose required argument is unset (its
    class's default does not apply): named, and how to give it; None where no class given is so.
    jsonargparse's report says only that the list's value is no Logger."""
    import importlib
    import inspect

    for m in re.finditer(r"Namespace\(class_path='([\w.]+)', init_args=Namespace\((.*?)\)\)", text):
        module, _, name = m[1].rpartition(".")
        try:
            parameters = inspect.signature(getattr(importlib.import_module(module), name)).parameters
        except (ImportError, AttributeError, TypeError, ValueError):
            continue
        empty = inspect.Parameter.empty
        if unset := [
            a for a in re.findall(r"(\w+)=None", m[2]) if getattr(parameters.get(a), "default", 0) is empty
        ]:
            return (
                f"{name}'s {unset[0]} is not set: give it after the class, "
                f"{option}+={name} {option}.init_args.{unset[0]}=VALUE"
            )
    return None


def unimported(value: str | None) -> str | None:
    """Where a dotted class path (`gpt_ft.training.stoping.EarlyStopping`, no file) does not import:
    the deepest module found and the name it lacks; None for a value that is no such path."""
    import importlib

    if not value or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", value) or Path(value).suffix in FILES:
        return None
    parts = value.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        if hasattr(module, parts[i]):  # it imports: a class of another kind than the option takes
            return f"class_path {value!r} is not a class this option takes"
        return f"class_path {value!r} does not import: {'.'.join(parts[:i])} has no {parts[i]!r}"
    return f"class_path {value!r} does not import: there is no module {parts[0]!r} (nor a file of that name)"


FILES = (".yaml", ".yml", ".json")


def repository_cards(name: str) -> list[str]:
    """The paths of the cards of the repository the package runs from (its `tasks/`, beside the
    package) that `name` names: by its path's end (`glue/sst2.yaml`) or its name (`sst2`); none
    where there is no such folder (a wheel)."""
    tasks = Path(__file__).resolve().parents[2] / "tasks"
    wanted = name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"
    found = (
        [p for p in tasks.rglob("*.yaml") if p.as_posix().endswith(f"/{wanted}")] if tasks.is_dir() else []
    )
    return [os.path.relpath(p) if p.is_relative_to(Path.cwd()) else str(p) for p in sorted(found)]


def unreadable(value: str) -> str:
    """What a path the parser could not read is: missing (`absent`'s words), or no file it can read."""
    path = Path(value).expanduser()
    return "is not a file that can be read" if path.exists() else absent(path)


def plain(kind: str) -> str:
    """A type as jsonargparse names it, as written in code: "<class 'float'>" as float."""
    return re.sub(r"<class '([^']+)'>", r"\1", kind)


def card_in_mapping(given: str) -> str | None:
    """The card file of `--data` given as one mapping, `--data={task: FILE, ...}` (reported last)."""
    try:
        data = ast.literal_eval(given)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(data, dict) and isinstance(data.get("init_args"), dict):
        data = data["init_args"]
    task = data.get("task") if isinstance(data, dict) else None
    return task if isinstance(task, str) else None


def inline(line: str) -> bool:
    """Whether jsonargparse's "Expected a path but VALUE ..." is about a mapping or list typed inline
    (tried as a file's path first, then read as YAML), not about a path."""
    return line.removeprefix("Expected a path but ").startswith(("{", "["))


def yaml_file_problem(path: str | None) -> str | None:
    """What is wrong with a YAML file that exists but does not parse; None if it parses or is absent."""
    import yaml

    if not path or not Path(path).expanduser().is_file():
        return None
    try:
        yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        return f"{path} is not valid YAML: {yaml_problem(exc)}"
    except (OSError, UnicodeDecodeError):
        return None
    return None


def repeated_key(text: str) -> str | None:
    """Where a YAML text gives a mapping the same key twice ("line 7: key 'labels' appears twice"),
    which YAML's loaders take silently, the last one winning; None if none does (or it does not parse)."""
    import yaml

    try:  # (libyaml's parser where PyYAML has it: a tenth of the time)
        nodes = [yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))]
    except yaml.YAMLError:
        return None
    walked = set()  # an alias may make the graph cyclic (`init_args: &x {self: *x}`)
    while nodes:
        node = nodes.pop()
        if id(node) in walked:
            continue
        walked.add(id(node))
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key, value in node.value:
                name = (key.tag, key.value) if isinstance(key, yaml.ScalarNode) else id(key)  # 1 is not '1'
                if name in seen and key.tag != "tag:yaml.org,2002:merge":
                    return f"line {key.start_mark.line + 1}: key {key.value!r} appears twice"
                seen.add(name)
                nodes.append(value)
        elif isinstance(node, yaml.SequenceNode):
            nodes.extend(node.value)
    return None


def repeated_in_options(args: list[str]) -> str | None:
    """One sentence naming the option whose value, a mapping written inline, gives a key twice
    (`--trainer={max_steps: 2, max_steps: 3}`, which YAML takes silently, the last winning); None
    if none does."""
    for i, arg in enumerate(args):
        name, given, value = arg.partition("=")
        option = arg.startswith("--") or name == "-c"
        if not given and option and i + 1 < len(args):
            value = args[i + 1]
        if option and value.lstrip()[:1] in ("{", "[") and (twice := repeated_key(value)):
            said = twice if "\n" in value.strip() else twice.split(": ", 1)[1]  # ("line 1" of one line)
            return f"{name}: {said} in {value.strip()}; give it once."
    return None


def yaml_problem(exc) -> str:
    """A YAML parse error in one line: where and what."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + (getattr(exc, "problem", None) or str(exc).splitlines()[0])


def absent(path: str | os.PathLike) -> str:
    """What a path found missing is: it "does not exist", or is a symbolic link that leads nowhere."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "is a loop of symbolic links"
        if os.path.islink(path):
            return f"is a symbolic link to {os.readlink(path)}, which does not exist"
    return "does not exist"


UNFOLDED_LIMIT = 1_000_000


def unfolds_too_far(value: object, limit: int = UNFOLDED_LIMIT) -> bool:
    """Whether a YAML document's value holds more than `limit` values once its aliases are written
    out (a node an alias repeats counts each time it is repeated): a few hundred bytes of aliases
    repeated inside aliases unfold to billions, which copying or checking the value never finishes.
    Each node is counted once (linear in the document's own size), or refused past a thousand
    levels deep."""
    sizes: dict[int, int] = {}

    def size(v: object) -> int:
        if not isinstance(v, dict | list):
            return 1
        if (known := sizes.get(id(v))) is None:
            parts = v.values() if isinstance(v, dict) else v
            known = sizes[id(v)] = min(limit + 1, 1 + sum(size(p) for p in parts))
        return known

    try:
        return size(value) > limit
    except RecursionError:
        return True
