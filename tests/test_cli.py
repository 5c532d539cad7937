"""One command, ``advpt``: the console script's subcommands, their help from the settings roots
(without torch), a run the same as ``python -m advpt.<module>``'s, and bad input refused in one
sentence."""

from __future__ import annotations

import ast
import csv
import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from advpt.__main__ import COMMANDS
from advpt.__main__ import main as dispatch
from advpt.config.cli import parse
from advpt.config.section import Section, field_docs, field_types
from advpt.config.tools import EmbedConfig, ExportFormat, ScoreConfig
from tests.helpers import REPO, child_env

ADVPT = Path(sys.executable).parent / "advpt"  # where pip installs the console script
HEAVY = ("torch", "deepspeed", "numpy")
TORCH_ROOTS = {"train", "finetune"}  # their settings import the model presets, and torch


def _advpt(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``advpt ARGS`` through the installed console script, in a fresh process."""
    assert ADVPT.is_file(), f"no console script {ADVPT}: pip install -e . (pyproject's scripts)"
    return subprocess.run(
        [str(ADVPT), *args],
        cwd=REPO, env=env or child_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _words(text: str) -> str:
    return " ".join(text.split())


def _documented(root: type) -> dict[str, str]:
    """Setting name -> its docstring, of the root's own fields and its sections'."""
    docs = {}
    for name, kind in field_types(root).items():
        if isinstance(kind, type) and issubclass(kind, Section):
            docs |= {sub: field_docs(kind)[sub] for sub in field_types(kind)}
        else:
            docs[name] = field_docs(root)[name]
    return docs


def test_advpt_help_lists_every_command_with_its_line():
    done = _advpt("--help")
    assert done.returncode == 0, done.stderr
    text = _words(done.stdout)
    for name, entry in COMMANDS.items():
        assert f"{name} {entry.summary}" in text


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_helps_with_the_docstring_of_every_flag(name):
    done = _advpt(name, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: advpt {name} ")
    text, root = _words(done.stdout), COMMANDS[name].settings_root()
    positionals = getattr(root, "POSITIONALS", ())
    for setting, doc in _documented(root).items():
        assert doc, f"{root.__name__}.{setting} has no docstring"
        assert doc.replace("%%", "%") in text, f"advpt {name} --help lacks the help of {setting}"
        assert (setting.upper() if setting in positionals else f"--{setting} ") in text


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_help_is_the_modules_own(name, capsys):
    """The dispatcher prints its command's help from the settings root alone: the root it names
    is the one its module parses, and the help is the same either way."""
    module = importlib.import_module(COMMANDS[name].module)
    helped = []
    for run, argv in ((dispatch, [name, "--help"]), (module.main, ["--help"])):
        with pytest.raises(SystemExit) as stop:
            run(argv)
        assert stop.value.code == 0
        helped.append(capsys.readouterr().out)
    assert helped[0] == helped[1] and helped[0].startswith(f"usage: advpt {name} ")


@pytest.mark.parametrize(
    "args", [["--help"]] + [[n, "--help"] for n in COMMANDS if n not in TORCH_ROOTS], ids=" ".join
)
def test_help_imports_neither_torch_nor_deepspeed(args):
    """Checked in a fresh process, through the console script, by Python's own import log."""
    done = _advpt(*args, env=child_env() | {"PYTHONPROFILEIMPORTTIME": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()]
    assert "advpt.config.cli" in imported  # the log is the one read here
    assert sorted({m for m in imported if m.split(".")[0] in HEAVY}) == []


def test_a_run_through_the_console_script_is_the_modules(tmp_path):
    """``advpt score`` and ``python -m advpt.score`` on a tiny export: the same scores, the same
    words."""
    import torch

    from advpt.models import ENCODER_PRESETS, MaskedLanguageModel
    from advpt.models.exports import save_export

    torch.manual_seed(0)
    save_export(MaskedLanguageModel(ENCODER_PRESETS["tiny"]), tmp_path / "model")
    mutations = tmp_path / "mutations.csv"
    mutations.write_text("mutant,DMS_score\nA4G,0.5\nK6R,-1\nA4G:K6R,0.1\n")
    flags = ["--sequence", "MKTAYKAQ", "--mutations", str(mutations), "--device", "cpu"]
    scored = {}
    for how, command in [("console", [str(ADVPT), "score"]),
                         ("module", [sys.executable, "-m", "advpt.score"])]:  # fmt: skip
        out = tmp_path / f"{how}.csv"
        done = subprocess.run(
            [*command, str(tmp_path / "model"), *flags, "--out", str(out)],
            cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        with open(out, newline="") as handle:
            scored[how] = (done.stdout.replace(str(out), "OUT"), list(csv.DictReader(handle)))
    assert scored["console"] == scored["module"]
    assert len(scored["console"][1]) == 3 and "scored 3 variants" in scored["console"][0]


def _refused(done: subprocess.CompletedProcess) -> str:
    """The one line a refused command ends in, exit code 2 and no traceback asserted."""
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr.strip().splitlines()[-1]


def test_an_unknown_or_missing_command_is_argparses_sentence():
    assert _refused(_advpt("trian")).startswith(
        "advpt: error: argument COMMAND: invalid choice: 'trian' (choose from 'train', "
    )
    assert _refused(_advpt()) == "advpt: error: the following arguments are required: COMMAND"


def test_bad_values_are_one_sentence(tmp_path):
    run_file = tmp_path / "run.yaml"
    run_file.write_text("layers: [0, last]\n")
    refusals = {
        ("score", "m", "--sequence", "MK", "--mutations", "m.csv", "--out", "o.csv",
         "--tokens_per_batch", "0"): "advpt: error: --tokens_per_batch must be positive",
        ("score", "m", "--out", "o.csv"):
            "advpt: error: the following settings are required: --sequence, --mutations",
        ("embed", "m", "in.fasta", "--config", str(run_file)):
            f"advpt: error: run file {run_file}: setting 'layers' must be a list, each a 64-bit "
            "integer, got [0, 'last']",
        ("swissprot", "--out", str(tmp_path / "corpus"), "--limit", "0"):
            "advpt: error: --limit must be at least 1, not 0",
        ("report", str(tmp_path), "--no_plots", "maybe"):
            "advpt report: error: argument --no_plots: expected true or false, got 'maybe'",
    }  # fmt: skip
    for args, sentence in refusals.items():
        done = _advpt(*args)
        assert _refused(done) == sentence
        if sentence.startswith("advpt: "):  # advpt's own refusals are the sentence alone
            assert done.stderr == sentence + "\n"


def test_the_export_formats_are_the_writers():
    from advpt.export import WRITERS

    assert sorted(WRITERS) == sorted(get_args(ExportFormat))


def test_argparse_is_built_in_one_place():
    """Flags come from settings roots: only ``config/cli.py`` (and the dispatcher's parser of the
    command's name) build an argparse parser."""
    package = REPO / "advpt"
    users = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if any(
            isinstance(node, ast.Import)
            and any(a.name == "argparse" for a in node.names)
            or isinstance(node, ast.ImportFrom)
            and node.module == "argparse"
            for node in ast.walk(ast.parse(path.read_text()))
        )
    )
    assert users == ["__main__.py", "config/cli.py"]


def test_a_run_file_sets_a_required_setting_and_a_shared_section(tmp_path, capsys):
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps({"sequence": "MK", "inference": {"tokens_per_batch": 64}}))
    flags = ["model", "--config", str(run_file), "--mutations", "m.csv", "--out", "o.csv"]
    config = parse(ScoreConfig, flags)
    assert (config.model, config.sequence, config.inference.tokens_per_batch) == ("model", "MK", 64)
    with pytest.raises(SystemExit) as stop:
        parse(ScoreConfig, flags[1:])  # a positional is the command line's
    assert stop.value.code == 2
    assert capsys.readouterr().err.endswith("error: the following arguments are required: MODEL\n")


@pytest.mark.parametrize(
    ("flags", "per_residue"),
    [
        (["--per_residue"], True),
        (["--per_residue", "false"], False),
        (["--per_residue", "yes"], True),
    ],
)
def test_a_bare_true_false_flag_before_the_positionals_leaves_them_alone(flags, per_residue):
    """argparse alone reads ``advpt embed --per_residue MODEL INPUT`` as ``--per_residue MODEL``
    (not a true/false value: an error); a word that is one stays the flag's value."""
    config = parse(EmbedConfig, [*flags, "runs/a", "seqs.fasta", "--out", "a.npz"])
    assert (config.per_residue, config.model, config.input) == (per_residue, "runs/a", "seqs.fasta")
