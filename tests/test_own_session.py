"""The modules that run as a pytest session of their own (tests/conftest.py's `OWN_SESSION`), in the
background, when the whole suite runs: their tests pass there."""

import os
import sys

import pytest

from tests.background import Command
from tests.conftest import INNER, OWN_SESSION, whole_suite
from tests.helpers import ROOT


def start_own_session(root, pytestconfig):
    if not whole_suite(pytestconfig):  # (their tests run in this session)
        return []
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={root / 'tmp'}"]
    return [Command([*argv, *OWN_SESSION], cwd=ROOT, env={**os.environ, INNER: "1"}, preloaded=True)]


@pytest.mark.background(start=start_own_session, first=True)
def test_the_modules_of_a_session_of_their_own_pass(background):
    if not background.runs:
        pytest.skip("their tests run in this session")
    (run,) = background.runs
    said = "\n".join((run.stdout + run.stderr).splitlines()[-80:])
    assert run.returncode == 0, said
    print(said.splitlines()[-1] if said else "")
