"""Settings: one documented, type-checked style for pre-training and fine-tuning."""

import dataclasses
import json
import typing

import pytest

from advpt.config.cli import OLD_SECTIONS, build_parser, parse
from advpt.config.evaluation import EvaluateConfig
from advpt.config.finetuning import FinetuneConfig
from advpt.config.pretrain import MethodConfig, ModelConfig, TrainConfig
from advpt.config.section import field_docs
from advpt.errors import ConfigError
from advpt.models import ENCODER_PRESETS, NOISER_PRESETS, TRANSFORMER_NOISER_PRESETS
from advpt.models.heads import POOLINGS, HeadConfig
from advpt.recipes import RECIPES
from advpt.tasks import SS_LABELS, TAPE_TASKS


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
        (
            ["--mode", "random", "--random_rate", "0", "--adversarial_rate", "0"],
            "--random_rate and --adversarial_rate are both 0: nothing would be masked",
        ),
    ],
)
def test_bad_settings_are_one_sentence_errors(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse(TrainConfig, flags)


def test_defaults_are_the_papers():
    config = parse(TrainConfig, [])
    assert config.method.schedule == "alternating"
    assert config.masking.estimator == "mixed"
    assert config.model.noiser_arch == "gru" and not config.model.noiser_context_only
    assert config.masking.noiser_entropy_bonus == 0.0
    assert (config.masking.random_rate, config.masking.adversarial_rate) == (0.1, 0.1)


def _all_fields(root):
    for f in dataclasses.fields(root):
        kind = typing.get_type_hints(root)[f.name]
        if dataclasses.is_dataclass(kind):
            yield from ((kind, g) for g in dataclasses.fields(kind))
        else:
            yield root, f


@pytest.mark.parametrize("root", [TrainConfig, FinetuneConfig, EvaluateConfig])
def test_every_setting_has_help_that_reaches_help_output(root):
    text = " ".join(build_parser(root).format_help().split())
    for owner, f in _all_fields(root):
        doc = field_docs(owner).get(f.name)
        assert doc, f"{owner.__name__}.{f.name} has no docstring"
        assert doc in text, f"--help lacks the help of {f.name}"
        positional = f.name in getattr(root, "POSITIONALS", ())  # the models to evaluate
        assert (f"{f.name.upper()} [{f.name.upper()} ...]" if positional else f"--{f.name}") in text


def test_the_choices_of_a_flag_are_those_of_the_code_that_implements_them():
    for name in ENCODER_PRESETS:
        assert parse(TrainConfig, ["--encoder", name]).model.encoder == name
        assert parse(FinetuneConfig, ["--encoder", name]).encoder == name
    for name in NOISER_PRESETS:
        assert parse(TrainConfig, ["--noiser", name]).model.noiser == name
    assert set(TRANSFORMER_NOISER_PRESETS) <= set(NOISER_PRESETS)
    for task in TAPE_TASKS:
        assert parse(FinetuneConfig, ["--task", task]).task == task
    for label in SS_LABELS:
        assert parse(FinetuneConfig, ["--ss_label", label]).ss_label == label
    for pooling in POOLINGS:
        assert parse(FinetuneConfig, ["--pooling", pooling]).pooling == pooling
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
        ("max_steps: yes\n", "'max_steps' must be a 64-bit integer, got True"),
        ("run: {seed: 1.5}\n", "'seed' must be a 64-bit integer, got 1.5"),
        ("resume: 1\n", "'resume' must be true or false, got 1"),
        ("mode: [random]\n", "'mode' must be adversarial | random"),
        ("max_lenght: 3\n", "unknown setting 'max_lenght' \\(did you mean 'max_length'\\?\\)"),
    ],
)
def test_run_file_values_are_checked_against_the_declared_types(tmp_path, content, message):
    run_file = tmp_path / "run.yaml"
    run_file.write_text(content)
    with pytest.raises(ConfigError, match=f"run file {run_file}: setting .*{message}|{message}"):
        parse(TrainConfig, ["--config", str(run_file)])


def test_an_integer_is_a_float_and_flags_override_the_file_with_their_declared_type(tmp_path):
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps({"masking": {"random_rate": 0}, "optim": {"max_steps": 5}}))
    config = parse(TrainConfig, ["--config", str(run_file), "--max_steps", "2"])
    assert config.masking.random_rate == 0.0 and isinstance(config.masking.random_rate, float)
    assert config.optim.max_steps == 2


def test_a_yaml_alias_bomb_is_refused_in_a_short_sentence(tmp_path):
    # nine levels of nine references: a list of 9**9 strings if it were written out
    anchors = ['&l0 ["x","x","x","x","x","x","x","x","x"]']
    for level in range(1, 9):
        anchors.append(f"&l{level} [" + ", ".join([f"*l{level - 1}"] * 9) + "]")
    run_file = tmp_path / "bomb.yaml"
    run_file.write_text(f"max_steps: [{', '.join(anchors)}]\n")
    message = "'max_steps' must be a 64-bit integer, got \\[\\["
    with pytest.raises(ConfigError, match=message) as caught:
        parse(TrainConfig, ["--config", str(run_file)])
    assert len(str(caught.value)) < 250


def test_finetune_settings_share_the_style(tmp_path):
    config = parse(FinetuneConfig, ["--task", "fluorescence", "--lr", "3e-5", "--batch_size", "8"])
    assert (config.task, config.lr, config.batch_size) == ("fluorescence", 3e-5, 8)
    assert config.run_dir == "runs/finetune/fluorescence"
    with pytest.raises(ConfigError, match="'task' must be secondary_structure"):
        parse(FinetuneConfig, ["--task", "contact"])
    run_file = tmp_path / "ft.yaml"
    run_file.write_text("lr: null\nepochs: 2\n")
    assert parse(FinetuneConfig, ["--config", str(run_file)]).lr is None


def test_every_recipe_is_a_valid_set_of_flags():
    rates = {"random-15": 0.15, "random-40": 0.4, "sparse-simultaneous-40": 0.4}  # others: 20%
    others = {name: flags for name, flags in RECIPES.items() if name != "recommended"}
    assert RECIPES["recommended"] in others.values()  # the study's pick among the others
    for name, flags in others.items():
        config = parse(TrainConfig, flags)
        random = name.startswith("random") or name == "span"
        assert config.method.mode == ("random" if random else "adversarial"), name
        total = config.masking.random_rate + config.masking.adversarial_rate
        assert total == pytest.approx(rates.get(name, 0.2)), name
    assert parse(TrainConfig, RECIPES["span"]).masking.random_masking == "span"


def test_a_recipe_is_its_flags_and_a_run_file_or_flags_override_it(tmp_path):
    named = parse(TrainConfig, ["--recipe", "sparse-simultaneous"])
    assert named == parse(TrainConfig, RECIPES["sparse-simultaneous"])
    assert (named.method.joint_every, named.model.noiser_arch) == (2, "conv")
    run_file = tmp_path / "run.yaml"
    run_file.write_text("method: {joint_every: 4}\n")
    over = parse(TrainConfig, ["--recipe", "sparse-simultaneous", "--config", str(run_file)])
    assert (over.method.joint_every, over.method.schedule) == (4, "simultaneous")
    flag = parse(TrainConfig, ["--config", str(run_file), "--recipe", "recommended",
                               "--joint_every", "5"])  # fmt: skip
    assert flag.method.joint_every == 5
    with pytest.raises(SystemExit):  # argparse names the choices
        parse(TrainConfig, ["--recipe", "no-such-recipe"])


def test_section_names_are_no_setting_names_and_old_ones_are_settings_only():
    hints = typing.get_type_hints(TrainConfig)
    sections = {name for name, kind in hints.items() if dataclasses.is_dataclass(kind)}
    settings = [f.name for _, f in _all_fields(TrainConfig)]
    assert sections == {"method", "dataset", "model", "masking", "optim", "run"}
    assert len(settings) == len(set(settings)) and not sections & set(settings)
    assert set(OLD_SECTIONS) <= set(settings)


OLD_RUN_FILE = """\
data: {data: uniref50.fasta.gz, max_length: 256}
schedule: {schedule: simultaneous, max_steps: 200, noiser_steps: 3}
run: {mode: adversarial, run_dir: runs/old}
"""
NEW_RUN_FILE = """\
method: {mode: adversarial, schedule: simultaneous, noiser_steps: 3}
dataset: {data: uniref50.fasta.gz, max_length: 256}
optim: {max_steps: 200}
run: {run_dir: runs/old}
"""
FLAT_RUN_FILE = """\
data: uniref50.fasta.gz
schedule: simultaneous
max_length: 256
max_steps: 200
noiser_steps: 3
run_dir: runs/old
"""


def test_old_sections_new_sections_and_flat_keys_read_the_same(tmp_path):
    configs = []
    for name, content in [("old", OLD_RUN_FILE), ("new", NEW_RUN_FILE), ("flat", FLAT_RUN_FILE)]:
        run_file = tmp_path / f"{name}.yaml"
        run_file.write_text(content)
        configs.append(parse(TrainConfig, ["--config", str(run_file)]))
    assert configs[0] == configs[1] == configs[2]
    config = configs[0]
    assert (config.dataset.data, config.method.schedule, config.optim.max_steps) == (
        "uniref50.fasta.gz",
        "simultaneous",
        200,
    )
    assert config != parse(TrainConfig, [])


def test_a_runs_config_json_reads_back_as_a_run_file(tmp_path):
    config = parse(TrainConfig, ["--mode", "random", "--data", "x.fasta", "--max_steps", "7"])
    run_file = tmp_path / "config.json"
    run_file.write_text(json.dumps(config.to_dict()))
    assert parse(TrainConfig, ["--config", str(run_file)]) == config


def test_a_section_key_must_hold_a_mapping(tmp_path):
    run_file = tmp_path / "run.yaml"
    run_file.write_text("masking: 0.1\n")
    with pytest.raises(ConfigError, match="section 'masking' must hold a mapping of settings"):
        parse(TrainConfig, ["--config", str(run_file)])


@pytest.mark.parametrize(
    "config, message",
    [
        (
            TrainConfig(method=MethodConfig(mode="adverse")),
            "MethodConfig: setting 'mode' must be adversarial | random, got 'adverse'",
        ),
        (TrainConfig(model=ModelConfig(encoder="huge")), "setting 'encoder' must be tape-base"),
        (
            TrainConfig(model=ModelConfig(activation_checkpointing="2")),
            "setting 'activation_checkpointing' must be a 64-bit integer, got '2'",
        ),
        (TrainConfig(deepspeed_config=None), "TrainConfig: setting 'deepspeed_config' must be a"),
        (TrainConfig(method=MethodConfig(noiser_start_at=1.0)), "noiser_start_at must be in"),
        (FinetuneConfig(task="contact"), "FinetuneConfig: setting 'task' must be secondary"),
    ],
)
def test_a_config_built_in_code_is_held_to_its_declared_types_and_rules(config, message):
    with pytest.raises(ConfigError, match=message):
        config.validate()


def _numeric_settings(section: type) -> list[tuple[str, type]]:
    """(name, int or float) of every numeric setting of ``section`` and its sections."""
    found = []
    for name, kind in typing.get_type_hints(section).items():
        if dataclasses.is_dataclass(kind):
            found += _numeric_settings(kind)
            continue
        inner = [k for k in typing.get_args(kind) if k is not type(None)] or [kind]
        if inner[0] in (int, float) and len(inner) == 1:
            found.append((name, inner[0]))
    return found


NOT_FINITE = ["nan", "-nan", "inf", "-inf", "1e400"]
PAST_64_BITS = ["9" * 30, "-" + "9" * 30]


@pytest.mark.parametrize("root", [TrainConfig, FinetuneConfig])
def test_no_numeric_setting_takes_a_non_finite_or_past_64_bit_value(root, capsys):
    settings = _numeric_settings(root)
    assert ("lr", float) in settings and ("seed", int) in settings
    for name, kind in settings:
        for value in NOT_FINITE + (PAST_64_BITS if kind is int else []):
            with pytest.raises((ConfigError, SystemExit)) as refused:
                parse(root, [f"--{name}={value}"])
            if refused.type is ConfigError:
                assert f"'{name}' must be a" in str(refused.value)
            else:  # argparse: not an integer at all
                assert refused.value.code == 2
                assert f"argument --{name}: invalid int value" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1e-3"])
def test_an_infinite_or_non_positive_learning_rate_is_refused(value):
    with pytest.raises(ConfigError, match=r"'lr' must be a finite number|lr must be positive"):
        parse(TrainConfig, [f"--lr={value}"])
    assert parse(TrainConfig, ["--lr", "1e-30"]).lr == 1e-30  # tiny, but a learning rate


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_a_seed_outside_32_bits_is_refused(seed):
    with pytest.raises(ConfigError, match=r"seed must be in \[0, 2\*\*32\)"):
        parse(TrainConfig, [f"--seed={seed}"])
