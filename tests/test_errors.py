"""gpt_ft.errors: jsonargparse's nested reports and YAML errors as one sentence."""

import pytest
import yaml

from gpt_ft.errors import absent
from gpt_ft.errors.parsing import parse_error_message, yaml_problem


@pytest.mark.parametrize(
    ("report", "sentence"),
    [
        (
            "Parser key \"max_epochs\":\n  Expected a <class 'int'>. Got value: x",
            "--max_epochs: expected int, got 'x'.",
        ),
        (  # an empty value (`lr: ""` in a config file): jsonargparse's line ends after "Got value:"
            "Parser key \"lr\":\n  Expected a <class 'float'>. Got value: ",
            "--lr: expected float, got ''.",
        ),
        (  # `--seeds 0 1 2`: the list's first item alone taken
            "Parser key \"seeds\":\n  Expected a <class 'list'>. Got value: 0",
            "--seeds: expected list, got '0': a list is written [a, b, c] (one argument).",
        ),
        (  # YAML reads `{n_positions:64}` as the one key "n_positions:64", without a value
            "Parser key \"overrides\":\n  Expected a <class 'dict'>. Got value: {n_positions:64}",
            "--overrides: expected dict, got '{n_positions:64}': a mapping is written {key: value} (a space "
            "after each colon).",
        ),
        (
            "Parser key \"task\":\n  Problem with given class_path 'gpt_ft.adapters.SingleText':\n"
            "    Option 'txt' is not accepted",
            "--task: Option 'txt' is not accepted.",
        ),
        (
            "Parser key \"task\":\n  Problem with given class_path 'gpt_ft.adapters.SingleTxt':\n"
            "    module 'gpt_ft.adapters' has no attribute 'SingleTxt'",
            "--task: class_path 'gpt_ft.adapters.SingleTxt': module 'gpt_ft.adapters' has no attribute "
            "'SingleTxt'.",
        ),
        (
            'Parser key "data":\n  Parser key "tokenizer":\n    Expected a path but nowhere does not exist\n'
            "  Given value: nowhere",
            "--data.tokenizer: nowhere does not exist.",
        ),
        (
            'Parser key "data":\n  Does not validate against any of the types in typing.Union:\n'
            "    - Expected a <class 'NoneType'>\n    - Expected a <class 'int'>\n"
            "  Given value type: <class 'str'>\n  Given value: abc",
            "--data: expected int, got 'abc'.",
        ),
        (  # --data={batch_size: abc}: the mapping tried as a file's path first, then read
            'Parser key "data":\n\n'
            "  - Expected a path but {batch_size: abc} either not accessible or invalid\n"
            "  - Does not validate against any of the Union subtypes\n  Errors:\n"
            "    - Problem with given class_path 'gpt_ft.data.task_data.TaskDataModule':\n"
            "        Parser key \"batch_size\":\n          Expected a <class 'int'>. Got value: abc\n"
            "  Given value type: <class 'dict'>\n  Given value: {'batch_size': 'abc'}",
            "--data.batch_size: expected int, got 'abc'.",
        ),
        (  # --data={task: [a.yaml, b.yaml]}: neither a card's path nor a mapping
            'Parser key "data":\n  Errors:\n'
            "    - Problem with given class_path 'gpt_ft.data.task_data.TaskDataModule':\n"
            '        Parser key "task":\n          Errors:\n'
            "            - Not a valid subclass of TaskAdapter\n"
            "              Subclass types expect one of:\n              - a class path (str)\n"
            "          Given value type: <class 'list'>\n          Given value: ['a.yaml', 'b.yaml']\n"
            "  Given value type: <class 'dict'>\n  Given value: {'task': ['a.yaml', 'b.yaml']}",
            "--data.task: expected a task card (a file, or class_path and init_args), got "
            "['a.yaml', 'b.yaml'].",
        ),
        (  # a card's path with a quote in it: its repr in double quotes
            'Parser key "data":\n  Parser key "task":\n'
            "    Problem with given class_path 'gpt_ft.adapters.SingleText':\n"
            "      Option 'labelz' is not accepted\n"
            """  Given value: NestedArg(key='task', val="Bob's/card.yaml")""",
            "--data.task: Option 'labelz' is not accepted (in Bob's/card.yaml).",
        ),
        (  # a callback's bad value: its base class refusing the option after it is not the fault
            'Parser key "trainer.callbacks":\n  Does not validate against any of the Union subtypes\n'
            "  Subtypes: [list[lightning.pytorch.callbacks.callback.Callback], <class 'NoneType'>]\n"
            "  Errors:\n"
            "    - Problem with given class_path 'lightning.pytorch.callbacks.EarlyStopping':\n"
            "        Parser key \"patience\":\n          Expected a <class 'int'>. Got value: abc\n"
            "    - Problem with given class_path 'lightning.Callback':\n"
            "        Option 'patience' is not accepted\n    - Expected a <class 'NoneType'>\n"
            "  Given value: NestedArg(key='patience', val='abc')",
            "--trainer.callbacks.patience: expected int, got 'abc'.",
        ),
        (  # devices: [0, a] in a config file: the list quoted, its bad item named
            'Parser key "trainer.devices":\n  Does not validate against any of the Union subtypes\n'
            "  Subtypes: [list[int], <class 'str'>, <class 'int'>]\n  Errors:\n"
            "    - Expected a <class 'int'>. Got value: a\n    - Expected a <class 'str'>\n"
            "    - Expected a <class 'int'>\n  Given value type: <class 'list'>\n  Given value: [0, 'a']",
            "--trainer.devices: expected list[int] or str or int, got \"[0, 'a']\" (a is not an int).",
        ),
        (  # a logger built from the arguments, refusing them (MLflow's file store): its words, not the dump
            "Does not validate against any of the Union subtypes\n"
            "Subtypes: [<class 'Logger'>, <class 'bool'>]\n"
            "Errors:\n  - The file store is in maintenance mode; set MLFLOW_ALLOW_FILE_STORE=true.\n"
            "  - Expected a <class 'bool'>\n  - Expected a <class 'NoneType'>\nGiven value type: <class "
            "'Namespace'>\nGiven value: Namespace(class_path='lightning.pytorch.loggers.MLFlowLogger', "
            "init_args=Namespace(tracking_uri=None))",
            "MLFlowLogger refused its arguments: The file store is in maintenance mode; set "
            "MLFLOW_ALLOW_FILE_STORE=true.",
        ),
        (  # the same logger in a list (configs/trainer/mlflow.yaml's form), after a CSV logger built
            "Does not validate against any of the Union subtypes\nSubtypes: [<class 'Logger'>, "
            "collections.abc.Iterable[Logger], <class 'bool'>]\nErrors:\n"
            "  - Not a valid subclass of Logger. Got value: [Namespace(class_path='x.CSVLogger')]\n"
            "    Subclass types expect one of:\n    - a class path (str)\n"
            "    - a dict with class_path entry\n"
            "  - The file store is in maintenance mode.\n  - Expected a <class 'bool'>\n"
            "Given value type: <class 'list'>\nGiven value: [<x.CSVLogger object at 0x7f>, "
            "Namespace(class_path='lightning.pytorch.loggers.MLFlowLogger', init_args=Namespace())]",
            "MLFlowLogger refused its arguments: The file store is in maintenance mode.",
        ),
        ("invalid choice: 'x' (choose from 'a', 'b')", "invalid choice: 'x' (choose from 'a', 'b')."),
        ("", "invalid arguments."),
    ],
)
def test_parse_error_message_is_one_sentence(report, sentence):
    assert parse_error_message(report) == sentence


def test_yaml_problem_says_where_and_what():
    with pytest.raises(yaml.YAMLError) as bad:
        yaml.safe_load("a: [\n")
    assert yaml_problem(bad.value) == "line 2, column 1: expected the node content, but found '<stream end>'"
    assert yaml_problem(ValueError("no mark here\nsecond line")) == "no mark here"


def test_a_missing_path_says_whether_a_link_leads_nowhere(tmp_path):
    """A symbolic link that leads nowhere looks missing; the sentence says which link, and where to."""
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    (tmp_path / "gone.ckpt").symlink_to(tmp_path / "moved" / "last.ckpt")
    assert absent(tmp_path / "loop1") == "is a loop of symbolic links"
    assert (
        absent(tmp_path / "gone.ckpt")
        == f"is a symbolic link to {tmp_path}/moved/last.ckpt, which does not exist"
    )
    assert absent(tmp_path / "nothing") == "does not exist"
    assert absent(tmp_path / "moved" / "last.ckpt") == "does not exist"
