#!/usr/bin/env bash
# Set up the environment, pre-train on the bundled proteome, and summarise the run.
#
#   bash scripts/quickstart.sh [--paper] [extra train.py flags, e.g. --recipe sparse-simultaneous]
#
# GPU: tape-base encoder, bf16 configs, every visible GPU. CPU: the small preset and the CPU
# configs (200 encoder steps, and noiser steps if the setting has a noiser: a few minutes on 2
# cores once set up).
# Every stage says what it is doing; the run ends with its summary (advpt report).
#
# The recipe is advpt.recipes.RECIPES["recommended"], the one docs/study.md's evidence
# picks; --paper runs the paper's exact setting instead.
echo "[advpt] 1/2 environment: Python, PyTorch, DeepSpeed and advpt (installing what is missing)"
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
echo "[advpt]     $(python -m advpt env)"

RECIPE=(--recipe recommended)
if [ "${1:-}" = "--paper" ]; then
    RECIPE=()
    shift
    echo "[advpt]     recipe: none, the paper's exact setting"
else
    RECOMMENDED="$(python -c 'from advpt.recipes import RECIPES; print(*RECIPES["recommended"])')"
    echo "[advpt]     recipe: the recommended one (docs/study.md): $RECOMMENDED"
fi
RUN_DIR="runs/quickstart-$(date +%Y%m%d-%H%M%S)"
if [ "$ADVPT_GPUS" -gt 0 ]; then
    echo "[advpt] 2/2 pre-training on $ADVPT_GPUS GPU(s): tape-base encoder (and the paper's GRU"
    echo "[advpt]     noiser, if the setting has one), bf16, 2,000 encoder steps on the bundled"
    echo "[advpt]     proteome (2,100 proteins), into $RUN_DIR; its summary follows"
    deepspeed --log_level error --num_gpus "$ADVPT_GPUS" advpt/train.py \
        --deepspeed_config gpu-bf16 --noiser_deepspeed_config gpu \
        --encoder tape-base --noiser paper --max_length 512 \
        --max_steps 2000 --warmup_steps 200 --log_every 20 --eval_every 500 \
        --checkpoint_every 500 --run_dir "$RUN_DIR" "${RECIPE[@]}" "$@"
else
    echo "[advpt] 2/2 pre-training on the CPU: small encoder (and a small noiser, if the setting has"
    echo "[advpt]     one), 200 encoder steps on the bundled proteome (2,100 proteins), a few minutes"
    echo "[advpt]     on 2 cores, into $RUN_DIR; its summary follows"
    deepspeed --log_level error --num_gpus 1 advpt/train.py \
        --deepspeed_config cpu --noiser_deepspeed_config cpu \
        --encoder small --noiser small --max_length 128 \
        --max_steps 200 --warmup_steps 20 --log_every 10 --eval_every 100 \
        --checkpoint_every 100 --run_dir "$RUN_DIR" "${RECIPE[@]}" "$@"
fi
echo "[advpt] done; the plots are in $RUN_DIR/report.png. Next:"
echo "    advpt report $RUN_DIR   # this summary again (also while a run trains)"
echo "    tensorboard --logdir $RUN_DIR/tensorboard   # every metric"
echo "    bash scripts/quickstart.sh --recipe sparse-simultaneous   # a cheap adversarial run, then"
echo "    advpt report $RUN_DIR runs/quickstart-<other run> --out runs/compare   # compare"
