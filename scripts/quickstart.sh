#!/usr/bin/env bash
# Set up the environment, then pre-train adversarially on the bundled proteome.
#
#   bash scripts/quickstart.sh [extra train.py flags]
#
# GPU: tape-base encoder, bf16 configs, every visible GPU. CPU: the small preset and the CPU
# configs (200 encoder + 200 noiser steps: under 10 minutes on 2 cores, set-up included).
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"

RUN_DIR="runs/quickstart-$(date +%Y%m%d-%H%M%S)"
if [ "$ADVPT_GPUS" -gt 0 ]; then
    echo "[advpt] $ADVPT_GPUS GPU(s): tape-base, bf16"
    deepspeed --num_gpus "$ADVPT_GPUS" advpt/train.py \
        --deepspeed_config gpu-bf16 --noiser_deepspeed_config gpu \
        --encoder tape-base --noiser paper --max_length 512 \
        --max_steps 2000 --warmup_steps 200 --log_every 20 --eval_every 500 \
        --checkpoint_every 500 --run_dir "$RUN_DIR" "$@"
else
    echo "[advpt] no GPU: small preset on the CPU"
    deepspeed --num_gpus 1 advpt/train.py \
        --deepspeed_config cpu --noiser_deepspeed_config cpu \
        --encoder small --noiser small --max_length 128 \
        --max_steps 200 --warmup_steps 20 --log_every 10 --eval_every 100 \
        --checkpoint_every 100 --run_dir "$RUN_DIR" "$@"
fi
echo
echo "[advpt] done. Watch or revisit the run with:"
echo "    tensorboard --logdir $RUN_DIR/tensorboard"
