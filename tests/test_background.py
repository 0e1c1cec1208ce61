"""The harness that runs commands in the background (tests/background.py): a preloaded command, a
fork of the template process, runs as the same command started afresh would run."""

import sys

import pytest

from tests.background import TEMPLATE, Command

PROBE = """
import os, sys
print(os.getcwd(), sys.argv, os.environ.get("PROBE"), os.environ["OMP_NUM_THREADS"], sys.path[0])
print("own session:", os.getsid(0) == os.getpid())
print("to stderr", file=sys.stderr)
print("imported:", "lightning" in sys.modules, file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""
FAILURES = {
    "raises": "raise ValueError('boom')",
    "says": "import sys; sys.exit('gpt-ft: error: a sentence')",
    "ends": "print('done')",
}


def start_probes(root):
    env = {"PROBE": "seen", "PATH": "/usr/bin:/bin"}
    probes = [Command([sys.executable, "-c", PROBE, "3"], root, env, preloaded=p) for p in (False, True)]
    failures = [Command([sys.executable, "-c", code], root, preloaded=True) for code in FAILURES.values()]
    (root / "scripts").mkdir()
    (root / "scripts" / "probe.py").write_text(PROBE)
    script = [sys.executable, "scripts/probe.py", "4"]
    scripts = [Command(script, root, env, preloaded=p) for p in (False, True)]
    version = Command([sys.executable, "-m", "gpt_ft", "--version"], preloaded=True)
    return [*probes, *failures, version, *scripts]


@pytest.mark.background(start=start_probes)
def test_a_preloaded_command_runs_as_a_fresh_one(background):
    fresh, preloaded, raises, says, ends, version, script, preloaded_script = background.runs
    assert fresh.returncode == preloaded.returncode == 3
    assert preloaded.stdout == fresh.stdout  # working directory, arguments, environment, sys.path
    assert fresh.stdout.splitlines() == [
        f"{background.root} ['-c', '3'] seen 1 ",  # sys.path[0]: '' (the working directory)
        "own session: True",
    ]
    preloads = TEMPLATE is not None  # (no forkserver, as on Windows: started afresh)
    assert (fresh.stderr, preloaded.stderr) == (
        "to stderr\nimported: False\n",
        f"to stderr\nimported: {preloads}\n",
    )
    assert raises.returncode == 1 and raises.stderr.rstrip().endswith("ValueError: boom")
    assert "Traceback" in raises.stderr
    assert (says.returncode, says.stderr) == (1, "gpt-ft: error: a sentence\n")
    assert (ends.returncode, ends.stdout, ends.stderr) == (0, "done\n", "")
    assert version.returncode == 0 and version.stdout.startswith("gpt-ft ")
    # a script: its arguments, and its folder first on sys.path
    assert script.returncode == preloaded_script.returncode == 4
    assert preloaded_script.stdout == script.stdout
    assert script.stdout.splitlines()[0] == (
        f"{background.root} ['scripts/probe.py', '4'] seen 1 {background.root / 'scripts'}"
    )
    assert (script.stderr, preloaded_script.stderr) == (
        "to stderr\nimported: False\n",
        f"to stderr\nimported: {preloads}\n",
    )
