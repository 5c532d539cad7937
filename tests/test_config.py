"""Settings: one documented, type-checked style for pre-training and fine-tuning."""

import dataclasses
import json
import typing

import pytest

from advpt.config import (
    VARIANTS,
    EncoderPreset,
    FinetuneConfig,
    NoiserPreset,
    Pooling,
    SecondaryStructureLabels,
    Task,
    TrainConfig,
    build_parser,
    field_docs,
    parse_config,
    parse_finetune_config,
)
from advpt.errors import ConfigError
from advpt.models import ENCODER_PRESETS, NOISER_PRESETS, TRANSFORMER_NOISER_PRESETS
from advpt.models.heads import POOLINGS, HeadConfig
from advpt.tasks import SS_LABELS, TASKS


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--schedule", "joint"], "'schedule' must be alternating | simultaneous, got 'joint'"),
        (["--reversal_scale", "0"], "reversal_scale must be > 0"),
        (["--estimator", "ratio"], "'estimator' must be mixed | importance"),
        (["--importance_clip", "-1"], "importance_clip must be > 0"),
        (["--noiser_arch", "lstm"], "'noiser_arch' must be gru | transformer"),
        (["--encoder", "huge"], "'encoder' must be tape-base | small | tiny"),
        (
            ["--noiser_arch", "transformer", "--noiser_bidirectional", "false"],
            "noiser_bidirectional false needs noiser_arch gru",
        ),
        (
            ["--noiser_arch", "transformer", "--noiser_context_only"],
            "noiser_context_only needs noiser_arch gru",
        ),
        (["--noiser_entropy_bonus", "-0.1"], "noiser_entropy_bonus must be >= 0"),
        (["--collapse_entropy_threshold", "2"], "collapse_entropy_threshold must be in"),
        (["--noiser_warmup_steps", "-2"], "noiser_warmup_steps must be >= -1"),
    ],
)
def test_bad_settings_are_one_sentence_errors(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(flags)


def test_defaults_are_the_papers():
    config = parse_config([])
    assert config.schedule.schedule == "alternating"
    assert config.masking.estimator == "mixed"
    assert config.model.noiser_arch == "gru" and not config.model.noiser_context_only
    assert config.masking.noiser_entropy_bonus == 0.0
    assert config.masking_rates() == (0.1, 0.1)
    importance = parse_config(["--estimator", "importance"])
    assert importance.masking_rates() == (0.0, pytest.approx(0.2))


def _all_fields(root):
    for f in dataclasses.fields(root):
        kind = typing.get_type_hints(root)[f.name]
        if dataclasses.is_dataclass(kind):
            yield from ((kind, g) for g in dataclasses.fields(kind))
        else:
            yield root, f


@pytest.mark.parametrize("root", [TrainConfig, FinetuneConfig])
def test_every_setting_has_help_that_reaches_help_output(root):
    text = " ".join(build_parser(root).format_help().split())
    for owner, f in _all_fields(root):
        doc = field_docs(owner).get(f.name)
        assert doc, f"{owner.__name__}.{f.name} has no docstring"
        assert doc in text, f"--help lacks the help of {f.name}"
        assert f"--{f.name}" in text


def test_choices_are_those_of_the_modules_that_implement_them():
    assert typing.get_args(EncoderPreset) == tuple(ENCODER_PRESETS)
    assert typing.get_args(NoiserPreset) == tuple(NOISER_PRESETS)
    assert set(TRANSFORMER_NOISER_PRESETS) <= set(NOISER_PRESETS)
    assert typing.get_args(Pooling) == POOLINGS
    assert typing.get_args(SecondaryStructureLabels) == tuple(SS_LABELS)
    assert typing.get_args(Task) == tuple(TASKS)
    finetune = FinetuneConfig()
    head = HeadConfig()
    assert (finetune.head_hidden_size, finetune.head_dropout, finetune.pooling) == (
        head.hidden_size,
        head.dropout,
        head.pooling,
    )


@pytest.mark.parametrize(
    "content, message",
    [
        ("max_steps: yes\n", "'max_steps' must be an integer, got True"),
        ("run: {seed: 1.5}\n", "'seed' must be an integer, got 1.5"),
        ("resume: 1\n", "'resume' must be true or false, got 1"),
        ("mode: [random]\n", "'mode' must be adversarial | random"),
        ("max_lenght: 3\n", "unknown setting 'max_lenght' \\(did you mean 'max_length'\\?\\)"),
    ],
)
def test_run_file_values_are_checked_against_the_declared_types(tmp_path, content, message):
    run_file = tmp_path / "run.yaml"
    run_file.write_text(content)
    with pytest.raises(ConfigError, match=f"run file {run_file}: setting .*{message}|{message}"):
        parse_config(["--config", str(run_file)])


def test_an_integer_is_a_float_and_flags_override_the_file_with_their_declared_type(tmp_path):
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps({"masking": {"random_rate": 0}, "schedule": {"max_steps": 5}}))
    config = parse_config(["--config", str(run_file), "--max_steps", "2"])
    assert config.masking.random_rate == 0.0 and isinstance(config.masking.random_rate, float)
    assert config.schedule.max_steps == 2


def test_a_yaml_alias_bomb_is_refused_in_a_short_sentence(tmp_path):
    # nine levels of nine references: a list of 9**9 strings if it were written out
    anchors = ['&l0 ["x","x","x","x","x","x","x","x","x"]']
    for level in range(1, 9):
        anchors.append(f"&l{level} [" + ", ".join([f"*l{level - 1}"] * 9) + "]")
    run_file = tmp_path / "bomb.yaml"
    run_file.write_text(f"max_steps: [{', '.join(anchors)}]\n")
    with pytest.raises(ConfigError, match="'max_steps' must be an integer, got \\[\\[") as caught:
        parse_config(["--config", str(run_file)])
    assert len(str(caught.value)) < 250


def test_finetune_settings_share_the_style(tmp_path):
    config = parse_finetune_config(["--task", "fluorescence", "--lr", "3e-5", "--batch_size", "8"])
    assert (config.task, config.lr, config.batch_size) == ("fluorescence", 3e-5, 8)
    assert config.run_dir == "runs/finetune/fluorescence"
    with pytest.raises(ConfigError, match="'task' must be secondary_structure"):
        parse_finetune_config(["--task", "contact"])
    run_file = tmp_path / "ft.yaml"
    run_file.write_text("lr: null\nepochs: 2\n")
    assert parse_finetune_config(["--config", str(run_file)]).lr is None


def test_every_training_variant_is_a_valid_set_of_flags():
    for name, flags in VARIANTS.items():
        config = parse_config(flags)
        assert config.run.mode == ("random" if name.startswith("random") else "adversarial")
        assert sum(config.masking_rates()) == pytest.approx(0.15 if name == "random-15" else 0.2)
