"""Entry point: ``deepspeed advpt/train.py --deepspeed_config ... [flags]``.

Also runs as one process without the launcher: ``python -m advpt.train ...``. See
``python -m advpt.train --help`` for every flag and ``advpt/config/pretrain.py`` for what each does.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

# The launcher runs this file as a script; make the package importable from a source checkout.
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch.distributed as dist  # noqa: E402

from advpt.command import command  # noqa: E402
from advpt.config.cli import parse  # noqa: E402
from advpt.config.pretrain import TrainConfig  # noqa: E402
from advpt.data.unigram import residue_counts, unigram_entropy  # noqa: E402
from advpt.errors import EXIT_STOPPED, OutputError, ReportError  # noqa: E402
from advpt.run_checkpoints import checkpoint_tag  # noqa: E402
from advpt.training.assembly import build_trainer  # noqa: E402
from advpt.training.distributed import init_distributed  # noqa: E402
from advpt.training.plan import RunPlan  # noqa: E402
from advpt.training.preemption import StopSignals  # noqa: E402
from advpt.training.reporting.summary import report_run  # noqa: E402
from advpt.training.run_dir import RunDir, check_run_dir, misplaced_entry  # noqa: E402
from advpt.training.run_lock import RunDirLock, claim_run_dir  # noqa: E402
from advpt.training.trainer import Trainer  # noqa: E402


@command
def main(argv: list[str] | None = None) -> int:
    """Train; the exit code says how it ended (docs/reliability.md).

    0: finished. 2: bad input, configuration, files or file system (one sentence says which).
    3: stopped on non-finite steps. 75: stopped by SIGTERM/SIGUSR1 or before the wall-clock
    limit (--max_time, SLURM_JOB_END_TIME), after saving a checkpoint.
    """
    with StopSignals() as stop_signals, RunDirLock() as lock:
        config = parse(TrainConfig, argv, "advpt train")
        check = functools.partial(_check_run_dir, resume=config.run.resume)
        check(RunPlan.run_dir_of(config))  # before anything is built, then under the lock
        own_group = not dist.is_initialized()  # a caller's process group is left to the caller
        device = init_distributed()
        try:
            claim = functools.partial(claim_run_dir, lock=lock, check=check)
            trainer = build_trainer(config, device, stop_signals, claim)
            trainer.train()
            if trainer.is_main:
                _print_summary(trainer)
            # Every rank leaves together: the launcher ends the others when one exits.
            dist.barrier()
        finally:
            # Also after an error: a group left to the interpreter's exit may have its threads
            # destroyed while running ("terminate called without an active exception").
            if own_group and dist.is_initialized():
                dist.destroy_process_group()
        return EXIT_STOPPED if trainer.stopped_by else 0


def _check_run_dir(run_dir: RunDir, resume: bool) -> None:
    """Refuse an unusable run directory (``check_run_dir``): one whose entries a run could not
    use, or one holding a run unless ``resume``."""

    def occupied(run_dir: RunDir) -> str:
        if run_dir.holds_run() and not resume:
            return (
                f"run directory {run_dir} already holds a run; pass --resume to continue it or "
                "choose another --run_dir"
            )
        return misplaced_entry(run_dir)

    check_run_dir(run_dir, occupied)


def _print_summary(trainer: Trainer) -> None:
    """How the run ended, its summary (``python -m advpt.report``) and where everything is."""
    run_dir = trainer.run_dir
    if trainer.stopped_by:
        tag = checkpoint_tag(trainer.counters.step)
        print(
            f"\nstopped by {trainer.stopped_by} after step {trainer.counters.step}; checkpoint "
            f"{tag} is saved: continue with --resume (exit code {EXIT_STOPPED})"
        )
    view = trainer.stream.view
    entropy = unigram_entropy(residue_counts(view.dataset, view.selection, view.vocab))
    try:
        summary = report_run(run_dir, unigram=entropy)
    except (ReportError, OutputError, OSError) as exc:
        summary = f"advpt: no summary of {run_dir}: {exc}"
    print(f"\n{summary}")
    print(f"  checkpoints      {run_dir.checkpoints}")
    print(f"  metrics          {run_dir.metrics}")
    print(f"  tensorboard      tensorboard --logdir {run_dir.tensorboard}")


if __name__ == "__main__":
    sys.exit(main())
