"""Settings: one-sentence errors for bad values, and the paper's defaults."""

import pytest

from advpt.config import ConfigError, parse_config


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--schedule", "joint"], "schedule must be 'alternating' or 'simultaneous'"),
        (["--reversal_scale", "0"], "reversal_scale must be > 0"),
        (["--estimator", "ratio"], "estimator must be 'mixed' or 'importance'"),
        (["--importance_clip", "-1"], "importance_clip must be > 0"),
        (["--noiser_arch", "lstm"], "noiser_arch must be 'gru' or 'transformer'"),
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
