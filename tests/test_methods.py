"""Masking methods (``advpt.methods``): the built-ins the flags name, one chosen by name, entry
point or file, and an external method in one file that trains, resumes and is held to its
settings through the real command line like a built-in one."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from advpt.config.cli import parse
from advpt.config.pretrain import TrainConfig
from advpt.data.bundled import BUNDLED_PROTEOME
from advpt.data.cache import open_data
from advpt.data.collate import MaskingCollator
from advpt.data.dataset import CroppedView
from advpt.data.sampling import split
from advpt.data.unigram import residue_counts
from advpt.errors import ConfigError
from advpt.methods import registry
from advpt.methods.alternating import AlternatingSchedule
from advpt.methods.base import ENCODER, JOINT, NOISER, RANDOM, EncoderSteps
from advpt.methods.random_mlm import RandomMLM
from advpt.methods.registry import build_method, method_source
from advpt.methods.simultaneous import SimultaneousSchedule
from advpt.recipes import RECIPES
from advpt.tokenizer import TAPE
from advpt.training.checkpointing.migrate import migrate
from tests.helpers import REPO, read_metrics, run_in_process, tiny_run_args

FIXTURE = REPO / "tests" / "fixtures" / "surprisal_method.py"


def method_of(*flags: str):
    return build_method(parse(TrainConfig, list(flags)), TAPE)


@pytest.mark.parametrize(
    "recipe, name, rates, schedule, phases",
    [
        ("random", "random", (0.2, 0.0), EncoderSteps, {ENCODER}),
        ("span", "random", (0.2, 0.0), EncoderSteps, {ENCODER}),
        ("alternating", "alternating", (0.1, 0.1), AlternatingSchedule, {NOISER, ENCODER, RANDOM}),
        ("context-warmup", "alternating", (0.1, 0.1), AlternatingSchedule,
         {NOISER, ENCODER, RANDOM}),
        ("simultaneous", "simultaneous", (0.1, 0.1), SimultaneousSchedule,
         {JOINT, ENCODER, RANDOM}),
        ("sparse-simultaneous", "simultaneous", (0.1, 0.1), SimultaneousSchedule,
         {JOINT, ENCODER, RANDOM}),
        ("importance", "importance", (0.0, 0.2), AlternatingSchedule, {NOISER, ENCODER, RANDOM}),
    ],
)  # fmt: skip
def test_the_flags_name_a_built_in_method(recipe, name, rates, schedule, phases):
    method = method_of(*RECIPES[recipe])
    assert method.name == name and method.trains_noiser == (name != "random")
    assert method.masking_rates() == pytest.approx(rates)
    assert isinstance(method.schedule(), schedule) and set(method.phases()) == phases
    # the same method by name, whatever the flags say
    assert type(method_of("--masking_method", name)) is type(method)


def test_importance_follows_the_schedule_and_the_warmup_and_noiser_steps_follow_the_settings():
    both = method_of("--estimator", "importance", "--schedule", "simultaneous")
    assert both.name == "importance-simultaneous" and both.masking_rates() == (0.0, 0.2)
    assert set(both.phases()) == {JOINT, ENCODER, RANDOM}
    flags = ["--max_steps", "100", "--warmup_steps", "10", "--noiser_start_at", "0.25"]
    warm = method_of(*flags, "--schedule", "simultaneous", "--joint_every", "2")
    assert warm.warmup_steps() == 25 and warm.noiser_lr_steps() == (5, 37)
    assert RandomMLM(parse(TrainConfig, flags), TAPE).noiser_lr_steps() is None


def test_an_adversary_with_no_positions_to_choose_is_refused():
    # a setting with no adversarial budget, made adversarial: the noiser would learn nothing
    with pytest.raises(ConfigError, match="--mode adversarial with --adversarial_rate 0 leaves"):
        method_of("--recipe", "recommended", "--mode", "adversarial")
    importance = method_of("--recipe", "recommended", "--mode", "adversarial", "--estimator",
                           "importance")  # fmt: skip
    assert importance.masking_rates() == (0.0, 0.4)  # the whole total is the noiser's


def test_a_checkpoint_without_the_method_records_the_built_in_its_flags_name():
    def recorded(settings: dict) -> str:
        state = {"counters": {}, "schedule": {"phase": ENCODER}, "layout": {}, "settings": settings}
        return migrate(state, saved_world_size=1)["settings"]["masking_method"]

    assert recorded({"mode": "random", "schedule": "simultaneous"}) == "random"
    assert recorded({"mode": "adversarial"}) == "alternating"
    assert recorded({"schedule": "simultaneous", "estimator": "importance"}) == (
        "importance-simultaneous"
    )
    assert recorded({"masking_method": "x"}) == "x"
    # and a built-in's record is its name, by flags or by name alike
    flags = parse(TrainConfig, ["--schedule", "simultaneous"])
    named = parse(TrainConfig, ["--masking_method", "simultaneous"])
    assert method_source(flags).recorded == method_source(named).recorded == "simultaneous"


@pytest.mark.parametrize(
    "value, message",
    [
        ("paper", "--masking_method paper names no masking method (known: alternating, "),
        ("surprisal_method.py", "name the class in the file as path/to/file.py:ClassName"),
        ("{missing}:Method", "cannot read {missing} (No such file or directory)"),
        ("{fixture}:Surprisal", "{fixture} defines no Surprisal"),
        ("{fixture}:Phase", "Phase in {fixture} is not a subclass of "
         "advpt.methods.base.MaskingMethod with a name"),
        ("{fixture}:MaskingMethod", "MaskingMethod in {fixture} is not a subclass"),
        ("{broken}:Method", "broken.py fails to import (NameError: name 'undefined' is not "),
        ("{abstract}:Half", "Half in {abstract} does not define phases"),
    ],
)  # fmt: skip
def test_a_bad_masking_method_is_a_one_sentence_error(tmp_path, value, message):
    broken, abstract = tmp_path / "broken.py", tmp_path / "abstract.py"
    broken.write_text("undefined\n")
    abstract.write_text(
        "from advpt.methods.base import MaskingMethod\n\n\n"
        "class Half(MaskingMethod):\n    name = 'half'\n\n"
        "    def masking_rates(self):\n        return 0.2, 0.0\n"
    )
    paths = {"fixture": FIXTURE, "missing": tmp_path / "none.py", "broken": broken,
             "abstract": abstract}  # fmt: skip
    value, message = value.format(**paths), message.format(**paths)
    with pytest.raises(ConfigError) as caught:
        method_of("--masking_method", value)
    assert message in str(caught.value)
    assert str(caught.value).startswith(f"--masking_method {value}")
    assert "\n" not in str(caught.value)


def test_a_method_registered_in_code_is_found_by_name(monkeypatch):
    monkeypatch.setattr(registry, "_registered", {})

    @registry.register
    class Spans(RandomMLM):
        name = "spans-again"

    assert type(method_of("--masking_method", "spans-again")) is Spans
    with pytest.raises(ValueError, match="name 'random' is taken by RandomMLM"):
        registry.register(type("Other", (RandomMLM,), {"name": "random"}))


def test_surprisal_masks_rare_residues_more_often():
    """The fixture does what its docstring says: each row's budget, rare residues first."""
    dataset = open_data(BUNDLED_PROTEOME)
    train, _ = split(len(dataset), None, 0.05, 0, "record")
    view = CroppedView(dataset, train, 64, 0, TAPE)
    method = method_of("--masking_method", f"{FIXTURE}:SurprisalMasking")
    assert not method.trains_noiser and method.masking_rates() == (0.0, 0.2)
    method.prepare(view)
    collate = MaskingCollator(*method.masking_rates(), 0, TAPE)
    masked, seen = torch.zeros(TAPE.size), torch.zeros(TAPE.size)
    torch.manual_seed(0)
    for number in range(20):
        batch = collate(view.examples(np.arange(8 * number, 8 * number + 8), 0), number)
        draw = method.draw(batch)
        assert torch.equal(draw.sample.positions.sum(1), batch.budget)
        masked.index_add_(0, batch.ids[draw.sample.positions], torch.ones(int(batch.budget.sum())))
        seen.index_add_(0, batch.ids[batch.eligible], torch.ones(int(batch.eligible.sum())))
    share = masked / seen.clamp_min(1)
    common = residue_counts(dataset, train, TAPE).argmax()  # leucine, 9% of the residues
    for rare in "CW":  # under 1% each (X is rarer but comes in runs that spend a row's budget)
        assert share[TAPE.tokens.index(rare)] > 3 * share[common], rare


def run(tmp_path, run_dir, *flags: str):
    done = run_in_process(
        tiny_run_args(tmp_path, run_dir) + ["--num_workers", "0", "--log_every", "1", *flags]
    )
    return done.returncode, (done.stderr.strip().splitlines() or [""])[-1], done


def test_a_method_in_a_file_trains_resumes_and_keeps_its_settings(tmp_path, distributed):
    method_file = tmp_path / "surprisal_method.py"
    shutil.copy(FIXTURE, method_file)
    run_dir, method = tmp_path / "run", f"{method_file}:SurprisalMasking"
    common = ["--max_steps", "4", "--eval_every", "2"]
    code, _, done = run(tmp_path, run_dir, *common, "--masking_method", method,
                        "--stop_after_steps", "2")  # fmt: skip
    assert code == 0, done.stderr[-3000:]
    # a method that trains no noiser has no noiser engine
    assert not [p for p in (run_dir / "checkpoints").rglob("*noiser*")]

    # resumed with another method: refused, naming the method it was trained with
    code, error, _ = run(tmp_path, run_dir, *common, "--mode", "random", "--resume")
    assert code == 2 and error.startswith("advpt: error: checkpoint step00000002 in ")
    assert f"--masking_method {method_file}:SurprisalMasking (sha256 " in error
    assert "there, random here" in error
    # the same file, edited: refused too
    method_file.write_text(FIXTURE.read_text() + "# edited\n")
    code, error, _ = run(tmp_path, run_dir, *common, "--masking_method", method, "--resume")
    assert code == 2 and "--masking_method" in error and "--allow_setting_changes" in error

    shutil.copy(FIXTURE, method_file)
    code, _, done = run(tmp_path, run_dir, *common, "--masking_method", method, "--resume")
    assert code == 0, done.stderr[-3000:]
    assert f"run run ({method})" in done.stdout  # the summary names the method
    records = read_metrics(run_dir)
    steps = [r for r in records if "phase" in r]
    assert [r["encoder_step"] for r in steps] == [1, 2, 3, 4]
    assert {r["phase"] for r in steps} == {ENCODER} and not any("noiser_loss" in r for r in steps)
    assert all("mask_entropy" in r for r in steps)  # its draws are recorded
    assert [r["encoder_step"] for r in records if "val_loss" in r] == [2, 4]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["method"]["masking_method"] == method


def test_a_method_of_an_entry_point_trains_and_a_broken_one_is_named(
    tmp_path, distributed, monkeypatch
):
    site = tmp_path / "site"
    info = site / "advpt_surprisal-0.1.dist-info"
    info.mkdir(parents=True)
    shutil.copy(FIXTURE, site / "advpt_surprisal.py")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: advpt-surprisal\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[advpt.masking_methods]\n"
        "surprisal = advpt_surprisal:SurprisalMasking\n"
        "missing = advpt_nowhere:Method\n"
    )
    monkeypatch.syspath_prepend(str(site))
    flags = ["--max_steps", "2", "--masking_method"]
    code, _, done = run(tmp_path, tmp_path / "run", *flags, "surprisal")
    assert code == 0, done.stderr[-3000:]
    assert [r["phase"] for r in read_metrics(tmp_path / "run") if "phase" in r] == [ENCODER] * 2

    code, error, _ = run(tmp_path, tmp_path / "other", *flags, "missing")
    assert code == 2 and error == (
        "advpt: error: --masking_method missing: entry point advpt_nowhere:Method (group "
        "advpt.masking_methods) fails to load (ModuleNotFoundError: No module named "
        "'advpt_nowhere')"
    )
    code, error, _ = run(tmp_path, tmp_path / "other", *flags, "paper")
    assert code == 2 and "(known: alternating, " in error
    assert "entry points missing, surprisal)" in error
