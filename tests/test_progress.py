"""What a user sees while a run trains: a bar on a terminal, plain lines in a log file."""

import io

import pytest

from advpt.methods.alternating import AlternatingSchedule
from advpt.methods.base import ENCODER, EncoderSteps
from advpt.methods.simultaneous import SimultaneousSchedule
from advpt.training.engines.batch_layout import BatchLayout
from advpt.training.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(progress: Progress, schedule: AlternatingSchedule, encoder_steps: int) -> None:
    """Drive ``progress`` as the trainer does: every step, logging every 2, then validation at
    encoder step 2."""
    encoder_step = 0
    while encoder_step < encoder_steps:
        phase = schedule.phase
        schedule.advance()
        encoder_step += phase == ENCODER
        progress.step(phase, encoder_step)
        if progress.done % 2 == 0:
            progress.logged({"phase": phase, f"{phase}_loss": 3.0 + progress.done / 100,
                             "tokens_per_s": 1234.5})  # fmt: skip
        if phase == ENCODER and encoder_step == 2:
            progress.validated({"encoder_step": 2, "val_loss": 2.5, "val_accuracy": 0.25,
                                "val_perplexity": 12.18, "val_seconds": 0.4})  # fmt: skip
    progress.close()


def test_a_log_file_gets_plain_lines_over_both_phases():
    schedule, out = AlternatingSchedule(2, 2), io.StringIO()
    total = schedule.steps_until(4)
    assert total == 8
    _run(Progress(total, 0, 4, "adversarial pre-training", True, out), schedule, 4)
    text = out.getvalue()
    assert "\r" not in text
    lines = [line.split(" | ") for line in text.splitlines()]
    assert [line[0] for line in lines] == [
        "[advpt] step 2/8 (25%), encoder step 0/4, noiser phase",
        "[advpt] step 4/8 (50%), encoder step 2/4, encoder phase",
        "[advpt] validation at encoder step 2: loss 2.5000, accuracy 0.2500, perplexity 12.18 "
        "(0.4 s)",
        "[advpt] step 6/8 (75%), encoder step 2/4, noiser phase",
        "[advpt] step 8/8 (100%), encoder step 4/4, encoder phase",
    ]
    assert lines[0][1:3] == ["noiser loss 3.020", "1,234 tok/s"]
    # the last known loss of the other phase stays, the validation loss appears once known
    assert lines[1][1:3] == ["encoder loss 3.040", "noiser loss 3.020"]
    assert lines[3][1:4] == ["encoder loss 3.040", "noiser loss 3.060", "val loss 2.500 @2"]
    assert lines[4][-1].endswith("ETA 0s") and "elapsed" in lines[4][-1]


def test_a_terminal_gets_one_redrawn_bar_and_the_validation_line():
    out = Terminal()
    _run(Progress(8, 0, 4, "adversarial pre-training", True, out), AlternatingSchedule(2, 2), 4)
    text = out.getvalue()
    assert "\r" in text and "adversarial pre-training" in text and "8/8" in text
    assert "encoder | encoder loss 3.080 | noiser loss 3.060 | val loss 2.500 @2" in text
    assert text.count("[advpt] validation at encoder step 2: loss 2.5000") == 1
    assert "[advpt] step" not in text  # no plain lines on a terminal


@pytest.mark.parametrize("stream", [io.StringIO, Terminal])
def test_other_ranks_print_nothing(stream):
    out = stream()
    _run(Progress(8, 0, 4, "adversarial pre-training", False, out), AlternatingSchedule(2, 2), 4)
    assert out.getvalue() == ""


@pytest.mark.parametrize("noiser_steps, encoder_steps", [(10, 10), (3, 5), (1, 4)])
@pytest.mark.parametrize("adversarial", [True, False])
def test_total_steps_count_both_phases(noiser_steps, encoder_steps, adversarial):
    schedule = AlternatingSchedule(noiser_steps, encoder_steps) if adversarial else EncoderSteps()
    steps = encoder = 0
    for target in range(1, 23):
        while encoder < target:
            encoder += schedule.phase == ENCODER
            schedule.advance()
            steps += 1
        assert schedule.steps_until(target) == steps
    assert SimultaneousSchedule(noiser_steps).steps_until(7) == 7


def test_the_batch_sentence_names_its_parts_and_when_it_grows():
    def layout(micro, accumulation, ranks, max_steps, grow_at, factor):
        plain = BatchLayout(micro, ranks, {"encoder": accumulation})
        return plain.growing(max_steps, grow_at, factor)

    assert layout(16, 1, 2, 200, 0.8, 2).describe(200) == (
        "global batch 32 sequences = micro-batch 16 x 1 accumulation step(s) x 2 rank(s); from "
        "encoder step 161 of 200 it grows to 64 through accumulation (the paper's schedule; "
        "--batch_growth false keeps it)"
    )
    assert layout(8, 4, 1, 10, 0.8, 1).describe(10).endswith("x 1 rank(s), for the whole run")
    assert layout(8, 4, 1, 10, 1.0, 2).describe(10).endswith(", for the whole run")
    for max_steps, grow_at in ((200, 0.8), (7, 0.3), (10, 0.55), (3, 0.0)):
        grows = layout(8, 1, 1, max_steps, grow_at, 2)
        grown = [step for step in range(max_steps) if step >= grow_at * max_steps]  # the paper's
        assert [step for step in range(max_steps) if grows.grown(step)] == grown
        assert grows.global_batch(grown=True) == 2 * grows.global_batch() == 16
        assert f"from encoder step {grown[0] + 1} of" in grows.describe(max_steps)
