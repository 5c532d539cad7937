#!/usr/bin/env bash
# Adversarial pre-training as one srun step of a Slurm batch job, requeued at the time limit.
# Run by pretrain-1node.sbatch and pretrain-multinode.sbatch (which set the resources); its
# arguments are more advpt.train flags, e.g. --max_steps 200000 (docs/scaling.md, "On a cluster").
#
# DATA (required): a prepared dataset (python -m advpt.prepare, best done once on a shared
#   file system) or raw inputs, prepared into ADVPT_DATA_CACHE by one task per node.
# RUN_DIR (default runs/advpt-$SLURM_JOB_NAME): checkpoints, metrics, TensorBoard logs; on a
#   file system every node sees.
# ADVPT_DATA_CACHE (default $TMPDIR or /tmp, node-local scratch): where raw DATA is prepared.
#
# How a time-limited job continues:
# - `#SBATCH --signal=B:USR1@300` sends USR1 to this shell (only: "B:") about 5 minutes (Slurm
#   may send it up to a minute early) before the time limit; the trap passes it to srun, which
#   forwards it to every task. Signalling this shell rather than the tasks (no "B:") keeps the
#   signal to the training step alone, and lets the shell wait for the step and requeue it.
#   The 5 minutes must cover the step in progress and writing a checkpoint.
# - advpt finishes the step in progress, saves a checkpoint on every rank and exits 75;
# - on 75 this shell requeues the job (`#SBATCH --requeue`), which starts again from the top:
#   --resume continues from the newest complete checkpoint (and starts fresh in an empty
#   RUN_DIR, so the first start needs no other command).
# A job cancelled with scancel gets SIGTERM: advpt saves and exits too, and this shell ends
# without requeueing.
set -uo pipefail

: "${DATA:?set DATA to the training data (sbatch --export=ALL,DATA=...)}"
RUN_DIR=${RUN_DIR:-runs/advpt-${SLURM_JOB_NAME:-job}}
export ADVPT_DATA_CACHE=${ADVPT_DATA_CACHE:-${TMPDIR:-/tmp}/advpt-data}
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-8}

trap 'echo "advpt: time limit near: asking every task to save a checkpoint and stop"
      kill -USR1 "$step"' USR1

# One task per GPU; every task of a node sees all of its GPUs and takes the one of its local
# rank. --kill-on-bad-exit ends the step when one task fails, as the deepspeed launcher does.
srun --kill-on-bad-exit=1 python -m advpt.train \
    --deepspeed_config gpu-bf16 --noiser_deepspeed_config gpu \
    --data "$DATA" --run_dir "$RUN_DIR" \
    --recipe recommended \
    --resume "$@" &
step=$!

# `wait` returns early (status > 128) when the trap runs: wait again until srun has ended; a
# last `wait` gives its own status even if it ended while the trap ran.
wait "$step"
while kill -0 "$step" 2>/dev/null; do wait "$step"; done
wait "$step"
status=$?

if ((status == 75)); then
    echo "advpt: stopped with a checkpoint saved: requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
fi
exit "$status"
