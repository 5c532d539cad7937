"""A resume that changes how the run trains: refused in one sentence, or, with
--allow_setting_changes, recorded with its step and trained on with the phase carried over."""

import json

from advpt.methods.alternating import AlternatingSchedule
from advpt.methods.base import ENCODER, NOISER
from tests.helpers import read_metrics, run_in_process, tiny_run_args


def _files(run_dir):
    """Every file of the run directory but the checkpoints' and the lock, with its bytes."""
    return {
        p.relative_to(run_dir): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and "checkpoints" not in p.parts and p.name != ".lock"
    }


def test_a_changed_rate_is_refused_or_recorded_with_its_step(tmp_path, distributed):
    run_dir = tmp_path / "run"
    first = ["--mode", "random", "--random_rate", "0.1", "--adversarial_rate", "0.1"]
    common = ["--max_steps", "4", "--log_every", "1", "--num_workers", "0"]
    started = run_in_process(tiny_run_args(tmp_path, run_dir) + first + common
                             + ["--stop_after_steps", "2"])  # fmt: skip
    assert started.returncode == 0, started.stderr[-3000:]
    before = _files(run_dir)

    # --recipe recommended is random masking at another rate: the case that went unsaid
    changed = ["--recipe", "recommended", "--resume"]
    refused = run_in_process(tiny_run_args(tmp_path, run_dir) + changed + common)
    assert refused.returncode == 2
    error = refused.stderr.strip().splitlines()[-1]
    assert error.startswith("advpt: error: checkpoint step00000002 in ")
    assert "--random_rate 0.1 there, 0.4 here, --adversarial_rate 0.1 there, 0.0 here" in error
    assert "--allow_setting_changes" in error
    assert _files(run_dir) == before  # the refused start wrote nothing

    allowed = changed + ["--allow_setting_changes"]
    resumed = run_in_process(tiny_run_args(tmp_path, run_dir) + allowed + common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    changes = json.loads((run_dir / "setting_changes.json").read_text())
    assert changes == [
        {
            "step": 2,
            "encoder_step": 2,
            "changed": {"random_rate": [0.1, 0.4], "adversarial_rate": [0.1, 0.0]},
        },
    ]
    assert json.loads((run_dir / "config.json").read_text())["masking"]["random_rate"] == 0.4
    assert read_metrics(run_dir)[-1]["encoder_step"] == 4

    # resumed again with the new settings: no new change, the history is kept
    more = ["--recipe", "recommended", "--resume", "--max_steps", "5"]
    again = run_in_process(tiny_run_args(tmp_path, run_dir) + more + common[2:])
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((run_dir / "setting_changes.json").read_text()) == changes


def test_a_shorter_cycle_carries_the_phase_and_both_models_train_on(tmp_path, distributed):
    run_dir = tmp_path / "run"
    cycle = ["--noiser_steps", "3", "--encoder_steps", "3"]
    common = ["--max_steps", "5", "--log_every", "1", "--num_workers", "0"]
    first = run_in_process(tiny_run_args(tmp_path, run_dir) + cycle + common
                           + ["--stop_after_steps", "2"])  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    # saved after 3 noiser steps and 2 of the encoder's 3: resumed with a cycle of 1 + 1, the
    # encoder phase is full already and the noiser goes next
    shorter = ["--noiser_steps", "1", "--encoder_steps", "1", "--resume", "--allow_setting_changes"]
    resumed = run_in_process(tiny_run_args(tmp_path, run_dir) + shorter + common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    phases = [r["phase"] for r in read_metrics(run_dir) if "phase" in r]
    assert phases == ["noiser"] * 3 + ["encoder"] * 2 + ["noiser", "encoder"] * 3
    changes = json.loads((run_dir / "setting_changes.json").read_text())
    assert changes[0]["changed"] == {"noiser_steps": [3, 1], "encoder_steps": [3, 1]}


def test_the_alternating_schedule_ends_a_phase_longer_than_its_new_cycle():
    schedule = AlternatingSchedule(noiser_steps=1, encoder_steps=4)
    schedule.load_state_dict({"phase": NOISER, "steps_in_phase": 6})  # saved in a 10 + 10 cycle
    assert (schedule.phase, schedule.steps_in_phase) == (ENCODER, 0)
    schedule.load_state_dict({"phase": ENCODER, "steps_in_phase": 3})  # within the new cycle
    assert (schedule.phase, schedule.steps_in_phase) == (ENCODER, 3)
    schedule.advance()
    assert (schedule.phase, schedule.steps_in_phase) == (NOISER, 0)
