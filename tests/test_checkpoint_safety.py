"""Checkpoints under faults: damaged ones are passed over, failed saves leave nothing behind.

One real three-checkpoint run (random MLM, tiny encoder) is damaged in a fresh copy per test,
and its live engines decide what can be resumed. A full disk is a real file-size limit
(RLIMIT_FSIZE) on a real training process.
"""

from __future__ import annotations

import json
import logging
import pickle
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from advpt.errors import CheckpointError
from advpt.models import ENCODER_PRESETS
from advpt.run_checkpoints import recorded_encoder
from advpt.training.checkpointing import store
from tests.helpers import REPO, build_tiny_trainer, child_env, run_in_process, tiny_run_args

MODEL_FILE = "mp_rank_00_model_states.pt"


@pytest.fixture(scope="module")
def saved(tmp_path_factory, distributed):
    """A trainer whose run saved checkpoints step00000001..3 (random mode: 1 step = 1 tag)."""
    tmp = tmp_path_factory.mktemp("saved")
    schedule = ["--mode", "random", "--max_steps", "3", "--checkpoint_every", "1"]
    trainer = build_tiny_trainer(tmp, *schedule, "--keep_checkpoints", "3")
    trainer.train()
    return trainer


@pytest.fixture
def root(saved, tmp_path) -> Path:
    """A fresh copy of the saved run's checkpoints, to damage."""
    return Path(shutil.copytree(saved.run_dir.checkpoints, tmp_path / "checkpoints"))


def _resume(saved, root: Path, identity: dict | None = None) -> str | None:
    return store.resume_tag(root, saved.engines, identity or saved.checkpointer.identity)


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _same_size_raw_pickle(file: Path) -> None:
    """A plain pickle in place of a PyTorch archive, padded to the size the manifest records."""
    data = pickle.dumps({"module": {"w": [0.0] * 10}})
    file.write_bytes(data + bytes(file.stat().st_size - len(data)))


DAMAGE = {
    "truncated model file": (
        lambda r: _truncate(r / "encoder" / "step00000003" / MODEL_FILE),
        "bytes, not the",
    ),
    "raw pickle": (
        lambda r: _same_size_raw_pickle(r / "encoder" / "step00000003" / MODEL_FILE),
        "is not a PyTorch checkpoint archive",
    ),
    "missing rng state": (
        lambda r: (r / "rng" / "step00000003" / "rank0.pt").unlink(),
        "rank0.pt is missing",
    ),
    "no manifest": (
        lambda r: (r / "manifest" / "step00000003.json").unlink(),
        "its save never finished",
    ),
    "damaged manifest": (
        lambda r: (r / "manifest" / "step00000003.json").write_text("{"),
        "is unreadable",
    ),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(saved, root, caplog, case):
    damage, expected = DAMAGE[case]
    damage(root)
    with caplog.at_level(logging.WARNING):
        assert _resume(saved, root) == "step00000002"
    warning = caplog.text
    assert "the newest checkpoint" in warning and expected in warning and "step00000003" in warning
    assert (root / "latest").read_text().strip() == "step00000002"
    state = store.load_checkpoint(root, "step00000002", saved.engines)
    assert state["counters"]["encoder_step"] == 2


@pytest.mark.parametrize("latest", ["step00000009\n", "", "\x00garbage"])
def test_latest_naming_a_missing_or_no_tag_falls_back(saved, root, caplog, latest):
    (root / "latest").write_text(latest)
    with caplog.at_level(logging.WARNING):
        assert _resume(saved, root) == "step00000003"
    assert "cannot be resumed" in caplog.text


def test_no_usable_checkpoint_is_one_sentence(saved, root):
    for tag in ("step00000001", "step00000002", "step00000003"):
        _truncate(root / "encoder" / tag / MODEL_FILE)
    with pytest.raises(CheckpointError) as caught:
        _resume(saved, root)
    message = str(caught.value)
    assert message.startswith(f"--resume found no usable checkpoint in {root}: step00000003")
    assert "the 2 older one(s) are damaged too" in message and "\n" not in message


def test_crafted_file_with_a_forged_manifest_is_refused_without_running_it(saved, root):
    marker = root / "pwned"
    for tag in ("step00000001", "step00000002", "step00000003"):
        file = root / "encoder" / tag / MODEL_FILE
        torch.save({"module": _RunsCode(marker)}, file)
        manifest = root / "manifest" / f"{tag}.json"
        content = json.loads(manifest.read_text())
        content["files"][f"encoder/{tag}/{MODEL_FILE}"] = file.stat().st_size
        manifest.write_text(json.dumps(content))
    with pytest.raises(CheckpointError, match="holds more than tensors and plain data"):
        _resume(saved, root)
    assert not marker.exists()


class _RunsCode:
    """Unpickling this creates ``marker``: what a crafted checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_another_model_is_refused_naming_both(saved, root):
    other = {**saved.checkpointer.identity, "encoder": "small"}
    with pytest.raises(CheckpointError) as caught:
        _resume(saved, root, other)
    assert "encoder 'tiny' there, 'small' here" in str(caught.value)
    manifest = root / "manifest" / "step00000003.json"
    content = json.loads(manifest.read_text())
    content["shapes"]["encoder"]["encoder.token_embedding.weight"] = "33x32"
    manifest.write_text(json.dumps(content))
    with pytest.raises(CheckpointError, match="tensor 'encoder.token_embedding.weight' has shape"):
        _resume(saved, root)


def test_retention_keeps_the_newest_and_a_repeated_tag_changes_nothing(saved, root):
    store._prune(root, "step00000003", keep=1)
    assert sorted(p.name for p in (root / "encoder").iterdir()) == ["step00000003"]
    assert sorted(p.name for p in (root / "manifest").iterdir()) == ["step00000003.json"]
    with pytest.raises(ValueError, match="keep must be at least 1"):
        store.save_checkpoint(root, "step00000004", saved.engines, {}, 0, {})
    before = (root / "encoder" / "step00000003" / MODEL_FILE).read_bytes()
    store.save_checkpoint(root, "step00000003", saved.engines, {}, 1, {})
    assert (root / "encoder" / "step00000003" / MODEL_FILE).read_bytes() == before


def test_a_manifest_naming_its_encoder_preset_still_resumes_and_loads(saved, root):
    """Checkpoints written before every encoder setting was recorded name the preset instead."""
    for tag in ("step00000001", "step00000002", "step00000003"):
        manifest = root / "manifest" / f"{tag}.json"
        content = json.loads(manifest.read_text())
        assert content["architecture"]["encoder"]["hidden_size"] == 32  # every setting
        content["architecture"] = {"encoder": "tiny"}
        manifest.write_text(json.dumps(content))
    assert _resume(saved, root) == "step00000003"
    assert recorded_encoder(root, "step00000003") == ENCODER_PRESETS["tiny"]
    with pytest.raises(CheckpointError, match="encoder 'tiny' there, 'small' here"):
        _resume(saved, root, {"encoder": "small"})


def test_a_checkpoint_from_before_the_batch_layout_counts_one_ranks_micro_batches(saved, tmp_path):
    """Trainer states without a layout counted the data position in one rank's micro-batches:
    resumed, it is multiplied by the ranks that wrote them."""
    run_dir = Path(shutil.copytree(saved.run_dir, tmp_path / "run"))
    root, tag = run_dir / "checkpoints", "step00000003"
    file = root / "encoder" / tag / MODEL_FILE
    state = torch.load(file, weights_only=False)
    del state["trainer"]["layout"]
    torch.save(state, file)
    manifest = root / "manifest" / f"{tag}.json"
    content = json.loads(manifest.read_text())
    content["files"][f"encoder/{tag}/{MODEL_FILE}"] = file.stat().st_size
    content["world_size"] = 2  # written by two ranks, each at micro-batch 3 of its own
    manifest.write_text(json.dumps(content))
    schedule = ["--mode", "random", "--max_steps", "4", "--checkpoint_every", "1", "--resume"]
    trainer = build_tiny_trainer(tmp_path, *schedule, run_dir=run_dir)
    assert trainer.resumed and trainer.counters.micro_batches == 6
    assert trainer.layout.describe(4).startswith("global batch 8 sequences")  # no change noted


def _limit_file_size(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # writes beyond: EFBIG

    return apply


def test_disk_full_during_a_save_removes_it_and_keeps_the_previous_one(tmp_path, distributed):
    # ``distributed`` builds DeepSpeed's CPU collective op first: on a fresh machine the limited
    # child would otherwise JIT-compile it under the file-size limit and fail for that reason.
    run_dir = tmp_path / "run"
    args = tiny_run_args(tmp_path, run_dir) + [
        "--mode", "random", "--max_steps", "4", "--checkpoint_every", "2", "--num_workers", "0",
        "--val_max_batches", "1",
    ]  # fmt: skip
    first = run_in_process(args + ["--stop_after_steps", "2"])
    assert first.returncode == 0, first.stderr[-2000:]
    checkpoints = run_dir / "checkpoints"
    model_size = (checkpoints / "encoder" / "step00000002" / MODEL_FILE).stat().st_size
    full = subprocess.run(
        [sys.executable, "-m", "advpt.train", *args, "--resume"],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600,
        preexec_fn=_limit_file_size(model_size // 2),
    )  # fmt: skip
    assert full.returncode == 2, full.stderr[-3000:]
    last = full.stderr.strip().splitlines()[-1]
    assert last.startswith("advpt: error: saving checkpoint step00000004 failed (writing ")
    assert "could not be written in full (a full disk, a quota or a file size limit?)" in last
    assert f"its partial files were removed and {checkpoints / 'latest'}" in last
    assert "still names step00000002" in last and "Traceback" not in full.stderr
    assert (checkpoints / "latest").read_text().strip() == "step00000002"
    assert not any(checkpoints.glob("*/step00000004*"))
    done = run_in_process(args + ["--resume"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert (checkpoints / "latest").read_text().strip() == "step00000004"

    config = (run_dir / "config.json").read_text()
    other = run_in_process(args + ["--resume", "--max_steps", "6", "--encoder", "small"])
    assert other.returncode == 2 and "Traceback" not in other.stderr
    assert "written for another model than this run configures (encoder 'tiny' there, 'small' " in (
        other.stderr
    )
    assert (run_dir / "config.json").read_text() == config  # the run's own settings stay


def test_pretrained_run_with_a_damaged_newest_checkpoint_is_one_sentence(saved, tmp_path):
    from advpt.pretrained import load_encoder

    run_dir = Path(shutil.copytree(saved.run_dir, tmp_path / "run"))
    assert load_encoder(run_dir).cfg.hidden_size == 32
    _truncate(run_dir / "checkpoints" / "encoder" / "step00000003" / MODEL_FILE)
    with pytest.raises(CheckpointError) as caught:
        load_encoder(run_dir)
    message = str(caught.value)
    assert message.startswith(f"the newest checkpoint in {run_dir / 'checkpoints'}, step00000003")
    assert "bytes, not the" in message


class _ByName:
    """Pickles as ``getattr(owner, name)``, as Python 3.11.2 pickles an Enum member."""

    def __init__(self, owner, name):
        self.owner, self.name = owner, name

    def __reduce__(self):
        return getattr, (self.owner, self.name)


def test_enum_members_pickled_by_name_load_and_nothing_else_does(tmp_path):
    """Some Python releases write DeepSpeed's ZeroStageEnum as getattr(class, name): such a
    checkpoint loads, and getattr reaching anything but a member of an allowed Enum is refused."""
    from deepspeed.runtime.zero.config import ZeroStageEnum

    from advpt.safe_load import load_weights_only

    member = tmp_path / "member.pt"
    torch.save({"zero_stage": _ByName(ZeroStageEnum, "gradients")}, member)
    loaded = load_weights_only(member, [ZeroStageEnum])
    assert loaded["zero_stage"] is ZeroStageEnum.gradients
    for owner, name in ((ZeroStageEnum, "__class__"), (torch.Tensor, "add_")):
        crafted = tmp_path / "crafted.pt"
        torch.save({"zero_stage": _ByName(owner, name)}, crafted)
        with pytest.raises(CheckpointError, match="holds more than tensors and plain data"):
            load_weights_only(crafted, [ZeroStageEnum])


def test_trainer_states_of_older_formats_are_read_as_todays():
    from advpt.methods.alternating import AlternatingSchedule
    from advpt.methods.base import JOINT
    from advpt.methods.simultaneous import SimultaneousSchedule
    from advpt.training.checkpointing.migrate import migrate

    # written by two ranks before the layout and joint_every were recorded
    old = {"counters": {"encoder_step": 3, "micro_batches": 6}, "schedule": {"phase": JOINT}}
    state = migrate(old, saved_world_size=2)
    assert state["counters"]["micro_batches"] == 12  # the data position of both ranks
    assert old["counters"]["micro_batches"] == 6  # the checkpoint's own state is left as read
    joint = SimultaneousSchedule(joint_every=1)
    joint.load_state_dict(state["schedule"])
    assert (joint.steps, joint.phase) == (0, JOINT)
    with pytest.raises(ValueError, match="written by the simultaneous schedule"):
        AlternatingSchedule().load_state_dict(state["schedule"])
    today = {"counters": {"micro_batches": 6}, "schedule": {"phase": "noiser"}, "layout": {}}
    assert migrate(today, saved_world_size=2) == today


def test_a_latest_marker_naming_a_path_is_not_followed_out_of_the_run(saved, tmp_path):
    from advpt.pretrained import load_encoder

    run_dir = Path(shutil.copytree(saved.run_dir, tmp_path / "run"))
    outside = tmp_path / "manifest"  # what checkpoints/manifest/../../manifest.json would be
    outside.mkdir()
    (outside / "x.json").write_text("{}")
    (run_dir / "checkpoints" / "latest").write_text("../../x")
    with pytest.raises(CheckpointError) as caught:
        load_encoder(run_dir)
    assert (
        str(caught.value) == f"{run_dir / 'checkpoints' / 'latest'} names no checkpoint ('../../x')"
    )
