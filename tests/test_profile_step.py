"""The step profiler (scripts/profile_step.py): its arguments, checked before anything is built,
and a stop signal that comes while it times the noisers alone."""

import json
import signal
import subprocess
import sys

import pytest

from tests.helpers import REPO, child_env, load_script, refused_by_script, wait_until

TINY = ["--preset", "tiny", "--noiser", "tiny", "--recipes", "random", "--noisers", "gru"]


def test_a_bad_argument_ends_in_one_sentence_in_a_fresh_process():
    """As a user sees it (argparse's own refusals are checked in this process below)."""
    assert refused_by_script("profile_step", *TINY, "--max_length", "5000") == (
        "advpt: error: --max_length 5000 exceeds the 1024 positions of encoder tiny"
    )


def test_an_unknown_noiser_is_refused_by_argparse(capsys):
    with pytest.raises(SystemExit) as stop:
        load_script("profile_step").main([*TINY, "--noisers", "gru", "lstm"])
    assert stop.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.endswith(
        ": error: argument --noisers: invalid choice: 'lstm' (choose from 'gru', 'transformer', "
        "'conv')"
    )


@pytest.mark.parametrize(
    "flag, value, least",
    [("--max_length", "0", 1), ("--micro_batch", "0", 1), ("--warmup", "-1", 0),
     ("--cycles", "0", 1), ("--repeats", "0", 1)],
)  # fmt: skip
def test_every_number_is_checked_by_argparse(capsys, flag, value, least):
    with pytest.raises(SystemExit) as stop:
        load_script("profile_step").main([*TINY, flag, value])
    assert stop.value.code == 2
    said = f"argument {flag}: must be at least {least}, not {value}"
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.endswith(f": error: {said}")  # the prog: pytest's here


def test_what_argparse_cannot_check_is_one_sentence_before_anything_is_built(tmp_path, capsys):
    profile = load_script("profile_step")
    for flags, said in [
        (["--max_length", "2"], "max_length must be at least 3 tokens"),  # the trainer's rule
        (["--json", str(tmp_path)], f"--json {tmp_path} is a folder; name the file to write"),
    ]:
        assert profile.main([*TINY, *flags]) == 2
        assert capsys.readouterr().err == f"advpt: error: {said}\n"
    assert not list(tmp_path.iterdir())


def test_a_stop_signal_during_the_noiser_table_ends_with_75_and_keeps_everything(tmp_path):
    """After the last recipe, the profiler times each noiser alone; a SIGTERM then is not lost
    (it once was: the run went on and exited 0): 75, and the JSON holds the recipes and noisers."""
    out, printed = tmp_path / "rows.json", tmp_path / "stdout.txt"
    flags = ["--preset", "tiny", "--noiser", "tiny", "--max_length", "32", "--micro_batch", "4",
             "--recipes", "random", "--noisers", "gru", "transformer", "conv", "--repeats", "100",
             "--cycles", "1", "--warmup", "0", "--json", str(out)]  # fmt: skip
    with printed.open("w") as stdout:
        job = subprocess.Popen(
            [sys.executable, "scripts/profile_step.py", *flags], cwd=REPO, env=child_env(),
            stdout=stdout, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    wait_until(job, lambda: "| random |" in printed.read_text(), "the only recipe's row")
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 75, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("advpt: error: stopped by SIGTERM; the ")
    written = json.loads(out.read_text())
    assert [row["recipe"] for row in written["rows"]] == ["random"]
    assert [row["noiser"] for row in written["noisers"]] == ["gru", "transformer", "conv"]
    assert written["header"].endswith("(stopped early)")


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--ds_config", "gpu-bf17"], "DeepSpeed config gpu-bf17 is neither a file nor a shipped "
         "encoder config (cpu, cpu-bf16, gpu-bf16, gpu-bf16-zero2, gpu-fp16, gpu-lamb)"),
        (["--noiser_ds_config", "nope"], "DeepSpeed config nope is neither a file nor a shipped "
         "noiser config (cpu, gpu)"),
        (["--preset", "tiny", "--max_length", "2000"], "--max_length 2000"),
    ],
)  # fmt: skip
def test_trace_step_refuses_bad_arguments_in_one_sentence_before_building(capsys, flags, said):
    assert load_script("trace_step").main(["--cpu", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"advpt: error: {said}") and "\n" not in err
