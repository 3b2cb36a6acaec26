"""The examples run, the README's quick start is the quick-start example,
the CTC, RNN-T and LF-MMI training examples learn, and trigram rescoring
lowers the word error rate of bigram decoding.

The training example runs as a script in a subprocess, as a user would run
it: the suite's x64 and strict dtype promotion (conftest.py) are not what
it is written for (optax's adam mixes Python floats with int32 counts), and
`--shard` needs the device count fixed before jax is imported.
"""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
README = EXAMPLES.parent / "README.md"


def _run_script(name: str, *args: str, env: dict | None = None) -> str:
    """The script's stdout; fails the test, showing all output, on a non-zero exit."""
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if run.returncode != 0:
        pytest.fail(
            f"{name}.py {' '.join(args)} exited with {run.returncode}:\n{run.stdout}\n{run.stderr}"
        )
    return run.stdout


def _losses(stdout: str) -> tuple[float, float]:
    """(first, last) from the summary line `loss 6.146 -> 0.064 in 300 steps, ...`."""
    match = re.search(r"^loss (\S+) -> (\S+) in", stdout, re.MULTILINE)
    assert match, f"no loss summary in the output:\n{stdout}"
    return float(match[1]), float(match[2])


def test_quickstart_runs(capsys):
    spec = importlib.util.spec_from_file_location("quickstart", EXAMPLES / "quickstart.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    assert "equals -posteriors    : True" in capsys.readouterr().out


def _readme_quick_start() -> tuple[str, str]:
    """(code, shown output) of the README's quick start."""
    section = README.read_text().split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    (shown,) = re.findall(r"```text\n(.*?)```", section, re.DOTALL)
    return code, shown


def test_readme_quick_start_is_the_example_and_prints_what_it_shows(tmp_path):
    code, shown = _readme_quick_start()
    example = {line.strip() for line in (EXAMPLES / "quickstart.py").read_text().splitlines()}
    # Every line of code (comments and blank lines aside) is the example's.
    strays = [
        line
        for line in code.splitlines()
        if line.strip() and not line.lstrip().startswith("#") and line.strip() not in example
    ]
    assert not strays, f"README quick-start lines not in examples/quickstart.py: {strays}"
    script = tmp_path / "readme_quick_start.py"
    script.write_text(code)
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout == shown, "the README shows other output than its code prints"
    # And the example prints the same lines, numbers included.
    printed = _run_script("quickstart").splitlines()
    assert [line for line in shown.splitlines() if line not in printed] == []


@pytest.mark.slow  # ~17 s; tests/sharding/ checks the sharded CTC loss itself
def test_ctc_training_sharded_over_4_devices():
    stdout = _run_script(
        "ctc_training",
        "--shard",
        "--steps",
        "40",
        "--batch-size",
        "16",
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"},
    )
    assert "over 4 devices" in stdout, stdout
    first, last = _losses(stdout)
    assert last < 0.9 * first, (first, last)


def test_ctc_training_learns_to_decode():
    # The whole default run (~15 s): the loss falls and greedy decodes match.
    stdout = _run_script("ctc_training")
    first, last = _losses(stdout)
    assert last < 0.1 * first, (first, last)
    accuracy = re.findall(r"exact matches on 200 fresh sequences: (\d+)%", stdout)[-1]
    assert int(accuracy) >= 70, stdout


def test_rnnt_training_with_the_pruned_loss_learns():
    # A short run: warm-up on the simple loss, then simple + pruned.
    stdout = _run_script("rnnt_training", "--steps", "60", "--warmup", "25")
    first, last = _losses(stdout)
    assert last < 0.5 * first, (first, last)
    assert "greedy decode" in stdout


def test_mmi_training_learns_the_alignment():
    # A short run (~30 s, mostly compilation): the loss falls and, from the
    # phone sequences alone, the frames come to match the generating pdfs.
    stdout = _run_script("mmi_training", "--steps", "40")
    first, last = _losses(stdout)
    assert last < first - 0.3, (first, last)
    match = re.search(
        r"^frame accuracy (\S+)% -> (\S+)% \(Viterbi (\S+)% -> (\S+)%\)$", stdout, re.MULTILINE
    )
    assert match, stdout
    before, after, _, viterbi = (float(value) for value in match.groups())
    assert before < 20 and after > 60 and viterbi > 80, stdout


def test_rescoring_with_a_trigram_lowers_the_word_error_rate():
    # 20 utterances (~5 s, most of it compilation): the
    # bigram graph's 1-best, then its 10 best rescored with a trigram.
    stdout = _run_script("rescoring", "--utterances", "20")
    match = re.search(r"^WER 1-best (\S+)% -> rescored (\S+)% ", stdout, re.MULTILINE)
    assert match, stdout
    first, rescored = float(match[1]), float(match[2])
    assert rescored < 0.8 * first, stdout
    assert "10-best list" in stdout and "at most" in stdout, stdout
