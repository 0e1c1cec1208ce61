"""Errors as users read them: one sentence naming the file, field or value at fault."""

from __future__ import annotations

import re
from pathlib import Path


def parse_error_message(text: str) -> str:
    """jsonargparse's nested report of a bad argument as one sentence: the argument and the reason."""
    keys = list(dict.fromkeys(re.findall(r'Parser key "([^"]+)"', text)))
    lines = [line.strip(" -") for line in text.splitlines() if line.strip(" -")]
    values = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Given value:")]
    nested = re.search(r"NestedArg\(key='[^']*', val='([^']*)'\)", text)
    value = nested[1] if nested else values[0] if values else None
    where = f"--{'.'.join(keys)}: " if keys else ""
    unaccepted = [line for line in lines if "is not accepted" in line or "is not expected" in line]
    bad_class = [
        f"{line.removeprefix('Problem with given ').rstrip(':')}: {lines[i + 1]}"
        for i, line in enumerate(lines[:-1])
        if line.startswith("Problem with given class_path") and not lines[i + 1].startswith("Parser key")
    ]
    expected = [line for line in lines if line.startswith("Expected a ") and "NoneType" not in line]
    if unaccepted:
        reason = unaccepted[0]
    elif any(line.startswith("Expected a path but") for line in lines):
        reason = yaml_file_problem(value) or f"{value} is not a file that can be read"
    elif bad_class:
        reason = bad_class[-1] + (f" (in {value})" if value and value.endswith((".yaml", ".yml")) else "")
    elif expected:
        match = re.match(r"Expected a (.+?)(?:\. Got value: (.*))?$", expected[0])
        kind = re.sub(r"<class '([^']+)'>", r"\1", match[1])
        reason = f"expected {kind}, got {match[2] if match[2] is not None else value!r}"
    else:
        noise = ("Parser key", "Does not validate", "Subtypes:", "Errors:", "Given value")
        reasons = [line for line in lines if not line.startswith(noise)]
        reason = reasons[0] if reasons else lines[0] if lines else "invalid arguments"
    return f"{where}{reason.rstrip('.:')}."


def yaml_file_problem(path: str | None) -> str | None:
    """What is wrong with a YAML file that exists but does not parse; None if it parses (or is not
    there)."""
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


def yaml_problem(exc) -> str:
    """A YAML parse error in one line: where and what."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + (getattr(exc, "problem", None) or str(exc).splitlines()[0])
