#!/usr/bin/env bash
# Every GPU figure of docs/benchmarks.md in one command that ends by itself within eight minutes,
# on one CUDA machine that may be bare and offline (Python 3.12 with a CUDA build of torch, nvcc
# and ninja): what advpt needs beyond that is installed from wheels made beforehand by
# scripts/gpu_wheels.sh (see scripts/gpu_wheels.txt).
#
#   bash scripts/gpu_check.sh [all]      install, then every step below, most important first
#   bash scripts/gpu_check.sh report     gpu_check.json and gpu_check.md again from --out
#
# The steps, in order: build_sampler (the fused sampler kernel); cuda_tests (sampler kernel
# against the reference, masking, a micro-step of every phase under the sync debug mode);
# pretrain_paper, pretrain_sparse_simultaneous (short bf16 pre-training runs at tape-base,
# length 512: loss must fall, no NaN); throughput (MFU against the bf16 matmul peak measured in
# the same process; cost_vs_random of random 40%, alternating, simultaneous and
# sparse-simultaneous with the adversary's share of the step); overhead (random MLM on one fixed
# full-length micro-batch: DeepSpeed's bf16 optimizer at ZeRO 0 and 2, as shipped before,
# against bf16 autocast at ZeRO 0 with fused AdamW, as shipped now, and a bare PyTorch loop: ms
# per step, MFU, host syncs and ops per step); profile (a torch.profiler trace of
# 5 random-MLM steps at tape-base, length 512, gpu-bf16: the GPU-busy share, kernels per step,
# the top kernels and the attention kernel that ran); esm_650m (advpt's ESM-2 650M step
# against transformers', eager and compiled, with MFU); sampler_bench (fused sampler against the
# reference); zero_memory (peak memory at ZeRO 0 and 2); max_micro_batch (with and without
# activation checkpointing); fused_adam (DeepSpeed's FusedAdam, compiled here, against torch's
# fused AdamW that the shipped GPU configs use). Nothing compiles a DeepSpeed op before that last
# step.
#
# Options:
#   --out DIR      results (default runs/gpu_check): gpu_check.json (everything measured),
#                  gpu_check.md (the table of every figure with its goal, for
#                  docs/benchmarks.md) and gpu_check.log; three files, nothing else
#   --wheels DIR   where the wheels are (default wheels/ in the checkout); a relative DIR, here
#                  and for --out and --previous, is taken from the current directory
#   --previous F   an earlier gpu_check.json to merge this run into: its steps stay where this
#                  run has none of the same name (with --only: one table of both); it must be
#                  of this run's kind (a GPU run or a rehearsal), checked before any step
#   --only STEPS   run only these steps (comma-separated; to re-run the ones that failed)
#   --no-install   use the environment as it is (advpt's dependencies already installed)
#   --install      install from the wheels with --cpu too
#   --cpu          a rehearsal on the CPU with tiny sizes (and, unless --install, no install):
#                  every step runs the way the GPU run does, but its numbers are no GPU figures
#                  (two differences: torch.compile's eager backend traces the ESM step's graphs
#                  without generating kernels, which tests/test_compile.py covers on a CPU, and
#                  torch's AdamW stands in for DeepSpeed's, whose CPU op compiles for minutes)
#
# GPU_CHECK_COMMIT names the advpt commit in the results where the checkout has no .git.
#
# Each step runs under its own time limit, all of them under one deadline (GPU_CHECK_SECONDS,
# whole seconds, default 480) so that the command ends inside a nine-minute limit: a step that
# fails or runs out of time is recorded and the next one still runs; a step the deadline leaves
# no time for is recorded as skipped. A longer deadline lengthens every step's limit in
# proportion (GPU_CHECK_SECONDS=3600 for a rehearsal on a slow or busy machine). The exit status
# is 1 if any step did not succeed, 2 for a usage error, a missing wheel or a --previous that
# cannot be merged. Build caches (installed packages, run directories and, on a GPU, compiled ops
# unless TORCH_EXTENSIONS_DIR says otherwise) go to GPU_CHECK_CACHE (default
# runs/gpu_check_cache), so a second run on the same machine reuses the first one's builds.
set -uo pipefail
CALLER="$PWD"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$PWD"

usage() {
    sed -n '2,/^set /p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}

die() {
    echo "gpu_check: error: $*" >&2
    exit 2
}

from_caller() { # a path given on the command line, relative to where the command was run
    case "$1" in /*) echo "$1" ;; *) echo "$CALLER/$1" ;; esac
}

STEPS="build_sampler cuda_tests pretrain_paper pretrain_sparse_simultaneous throughput overhead"
STEPS+=" profile esm_650m sampler_bench zero_memory max_micro_batch fused_adam"
COMMAND=all
case "${1:-}" in all | report) COMMAND="$1"; shift ;; esac
OUT=runs/gpu_check
WHEELS=wheels
PREVIOUS=""
INSTALL=""
CPU=0
ONLY=""
while [ $# -gt 0 ]; do
    case "$1" in
        --out) [ $# -ge 2 ] || die "--out needs a directory"; OUT="$(from_caller "$2")"; shift 2 ;;
        --wheels) [ $# -ge 2 ] || die "--wheels needs a directory"; WHEELS="$(from_caller "$2")"
            shift 2 ;;
        --previous) [ $# -ge 2 ] || die "--previous needs a file"
            PREVIOUS="$(from_caller "$2")"; shift 2
            [ -f "$PREVIOUS" ] || die "--previous $PREVIOUS is not a file" ;;
        --only) [ $# -ge 2 ] || die "--only needs step names"; ONLY="${2//,/ }"; shift 2
            [ -n "${ONLY// /}" ] || die "--only needs step names, not an empty list" ;;
        --no-install) INSTALL=0; shift ;;
        --install) INSTALL=1; shift ;;
        --cpu) CPU=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see bash scripts/gpu_check.sh --help)" ;;
    esac
done
for name in $ONLY; do
    [[ " $STEPS " == *" $name "* ]] || die "there is no step '$name'; the steps: $STEPS"
done
[ "$COMMAND" = report ] && [ -n "$ONLY$PREVIOUS" ] && die "report takes --out only"
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" # advpt, from this checkout
if [ "$COMMAND" = report ]; then
    exec "$PYTHON" scripts/gpu_report.py render "$OUT"
fi
DEFAULT_SECONDS=480
DEADLINE_SECONDS="${GPU_CHECK_SECONDS:-$DEFAULT_SECONDS}"
[[ "$DEADLINE_SECONDS" =~ ^[1-9][0-9]*$ ]] \
    || die "GPU_CHECK_SECONDS must be a whole number of seconds above 0, not '$DEADLINE_SECONDS'"
# Before anything is written: a file that cannot be merged would lose this run's results.
if [ -n "$PREVIOUS" ]; then
    "$PYTHON" scripts/gpu_report.py previous "$PREVIOUS" --rehearsal "$CPU" || exit 2
fi

# The wheels of scripts/gpu_wheels.txt in $WHEELS, one per pin, into WHEEL_FILES; before
# anything is written, so that a missing wheel stops the check with nothing half-done.
find_wheels() {
    local pin name version files missing=()
    WHEEL_FILES=()
    while read -r pin; do
        name="${pin%%==*}"
        version="${pin#*==}"
        mapfile -t files < <(compgen -G "$WHEELS/${name//-/_}-$version-*.whl")
        if [ "${#files[@]}" -eq 1 ]; then WHEEL_FILES+=("${files[0]}"); else missing+=("$pin"); fi
    done < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' -e 's/[[:space:]]//g' scripts/gpu_wheels.txt)
    if [ "${#missing[@]}" -gt 0 ]; then
        die "$WHEELS holds no single wheel of ${missing[*]}. Make the wheels where pip reaches" \
            "PyPI with 'bash scripts/gpu_wheels.sh $WHEELS' and copy $WHEELS to this machine" \
            "(or pass --no-install where advpt's dependencies are installed)."
    fi
}

install_wheels() {
    # Installed once per machine: a reinstall would give DeepSpeed's op sources new times, and
    # ninja would compile its ops again.
    local stamp="$CACHE/site/.gpu_check_wheels"
    if [ "$(cat "$stamp" 2>/dev/null)" = "$(basename -a "${WHEEL_FILES[@]}")" ]; then
        echo "=== [install] the wheels of $WHEELS are installed in $CACHE/site"
    else
        echo "=== [install] ${#WHEEL_FILES[@]} wheels from $WHEELS into $CACHE/site"
        rm -rf "$CACHE/site"
        "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
            --target "$CACHE/site" "${WHEEL_FILES[@]}" \
            || die "pip could not install the wheels of $WHEELS"
        basename -a "${WHEEL_FILES[@]}" >"$stamp"
    fi
    export PYTHONPATH="$PYTHONPATH:$CACHE/site"
    export PATH="$CACHE/site/bin:$PATH"
    "$PYTHON" -c "import deepspeed, hjson, lmdb, pydantic, pyhmmer" \
        || die "the installed wheels do not import (see above)"
}

INSTALL="${INSTALL:-$((1 - CPU))}" # a GPU run installs, a rehearsal uses what is there
[ "$INSTALL" = 1 ] && find_wheels
mkdir -p "$OUT" || die "cannot make --out $OUT"
OUT="$(cd "$OUT" && pwd)"

CACHE="${GPU_CHECK_CACHE:-runs/gpu_check_cache}"
mkdir -p "$CACHE"
CACHE="$(cd "$CACHE" && pwd)"
RAW="$CACHE/raw"
rm -rf "$RAW"
mkdir -p "$RAW"
: >"$RAW/steps.jsonl"
LOG="$OUT/gpu_check.log"
: >"$LOG"
exec > >(tee -a "$LOG") 2> >(tee -a "$LOG" >&2)
DEADLINE=$((SECONDS + DEADLINE_SECONDS))
STRETCH=$((DEADLINE_SECONDS > DEFAULT_SECONDS ? DEADLINE_SECONDS : DEFAULT_SECONDS))
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export GPU_CHECK_CPU="$CPU" RAW
if [ "$CPU" = 1 ]; then # CPU ops build where every other CPU run finds them
    export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1
elif [ -z "${TORCH_EXTENSIONS_DIR:-}" ]; then
    export TORCH_EXTENSIONS_DIR="$CACHE/torch_extensions"
    # A build stopped by a step's time limit leaves its lock, and the next build of that op
    # would wait on it for ever; only gpu_check builds here, one step at a time.
    find "$TORCH_EXTENSIONS_DIR" -name lock -type f -delete 2>/dev/null
fi

# step NAME LIMIT COMMAND...: run COMMAND for at most LIMIT seconds (stretched by a longer
# deadline, cut by a nearer one) and record its name, status and time in $RAW/steps.jsonl.
step() {
    local name="$1" limit=$(($2 * STRETCH / DEFAULT_SECONDS)) status start rc
    shift 2
    if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then
        return
    fi
    local left=$((DEADLINE - SECONDS - 15)) # 15 s kept for the report
    start=$SECONDS
    if [ "$left" -lt 10 ]; then
        status=skipped
        rc=-1
        echo "=== [$name] skipped: the deadline is near"
    else
        [ "$limit" -gt "$left" ] && limit=$left
        echo "=== [$name] (limit ${limit} s) $*"
        timeout --kill-after=5 "$limit" "$@"
        rc=$?
        case $rc in
            0) status=ok ;;
            124 | 137) status=timeout ;;
            *) status=failed ;;
        esac
        echo "=== [$name] $status after $((SECONDS - start)) s"
    fi
    "$PYTHON" -c 'import json, os, sys
name, status, rc, seconds, limit, *command = sys.argv[1:]
command = " ".join(command).replace(os.getcwd() + "/", "")  # paths relative to the checkout
print(json.dumps({"name": name, "status": status, "rc": int(rc), "seconds": int(seconds),
                  "limit": int(limit), "command": command}))' \
        "$name" "$status" "$rc" "$((SECONDS - start))" "$limit" "$@" >>"$RAW/steps.jsonl"
}

environment() {
    if [ "$CPU" = 0 ]; then
        nvidia-smi
    fi
    local device=()
    [ "$CPU" = 1 ] && device=(--device cpu)
    "$PYTHON" -m advpt.environment --json "$RAW/environment.json" "${device[@]}" \
        ${GPU_CHECK_COMMIT:+--commit "$GPU_CHECK_COMMIT"}
}

pretrain() { # pretrain NAME RECIPE: a short real pre-training run of a recipe, bf16
    step "pretrain_$1" "$PRETRAIN_LIMIT" "$PYTHON" -m advpt.train \
        --deepspeed_config "$BF16_CONFIG" --noiser_deepspeed_config "$NOISER_CONFIG" \
        --recipe "$2" "${PRETRAIN[@]}" --run_dir "$RAW/pretrain-$1"
}

throughput() { # throughput NAME LIMIT [bench_throughput.py flags]
    local name="$1" limit="$2"
    shift 2
    step "$name" "$limit" "$PYTHON" scripts/bench_throughput.py "${BENCH[@]}" "$@" \
        --json "$RAW/$name.json"
}

if [ "$CPU" = 1 ]; then # tiny sizes and the CPU configs
    BF16_CONFIG=cpu-bf16
    NOISER_CONFIG=cpu
    PRETRAIN=(--encoder tiny --noiser tiny --max_length 64 --max_steps 8 --warmup_steps 2
        --log_every 2 --eval_every 8 --val_max_batches 2 --checkpoint_every 8 --num_workers 1)
    BENCH=(--cpu --preset tiny --max_length 64 --workers 0)
    MICRO=8 MICROS=(8) CAP=16 STEPS=2 WARMUP=2 ROUNDS=2
    ESM=(--preset esm2_tiny --batch 2 --length 24 --steps 1 --rounds 1 --warmup 0
        --compile_backend eager)
    SAMPLER=(--quick --device cpu --repeats 1)
    TRACE=(--cpu --preset tiny --noiser tiny --max_length 64 --micro_batch 8 --workers 0
        --steps 2 --warmup 1)
    ADAMS=(torch torch-fused) # DeepSpeed's CPU Adam would compile for minutes
else # the paper's sizes and the GPU configs
    BF16_CONFIG=gpu-bf16
    NOISER_CONFIG=gpu
    PRETRAIN=(--encoder tape-base --noiser paper --max_length 512 --max_steps 20
        --warmup_steps 5 --log_every 5 --eval_every 20 --val_max_batches 4 --checkpoint_every 20
        --num_workers 2)
    BENCH=(--preset tape-base --max_length 512 --precisions bf16 --workers 4)
    MICRO=64 MICROS=(32) CAP=4096 STEPS=8 WARMUP=4 ROUNDS=3
    ESM=(--preset esm2_t33_650M --batch 16 --length 512 --steps 3 --rounds 3 --warmup 2)
    SAMPLER=()
    TRACE=(--preset tape-base --max_length 512 --micro_batch 64 --workers 4 --steps 5 --warmup 3)
    ADAMS=(deepspeed torch-fused)
fi
PRETRAIN_LIMIT=90

[ "$INSTALL" = 1 ] && install_wheels
environment

step build_sampler 120 "$PYTHON" -c "import torch
from advpt.kernels import load_subset_sampler
if torch.cuda.is_available():
    assert load_subset_sampler() is not None, 'the fused sampler did not build'
else:
    print('no CUDA device: the kernel is not built (the CUDA tests skip it too)')"
step cuda_tests 120 "$PYTHON" -m pytest -q -rs -p no:cacheprovider -k "not compiles and not meta" \
    tests/test_sampler_kernel.py tests/test_masking.py tests/test_dry_run.py \
    --junitxml "$RAW/tests.xml"
pretrain paper alternating
pretrain sparse_simultaneous sparse-simultaneous
throughput throughput 180 --recipes random random-40 alternating simultaneous sparse-simultaneous \
    --checkpointing 0 --micro_batches "$MICRO" --zero 2 --steps "$STEPS" --warmup "$WARMUP" \
    --rounds "$ROUNDS"
throughput overhead 90 --recipes random --full_length --precisions bf16 bf16-autocast --zero 0 2 \
    --adam torch-fused --checkpointing 0 --micro_batches "$MICRO" --steps "$STEPS" \
    --warmup "$WARMUP" --rounds 2
step profile 60 "$PYTHON" scripts/trace_step.py "${TRACE[@]}" --ds_config "$BF16_CONFIG" \
    --noiser_ds_config "$NOISER_CONFIG" --json "$RAW/profile.json"
step esm_650m 150 "$PYTHON" scripts/bench_esm.py "${ESM[@]}" --dtype bf16 --compile \
    --json "$RAW/esm_650m.json"
step sampler_bench 60 "$PYTHON" scripts/bench_sampler.py "${SAMPLER[@]}" \
    --json "$RAW/sampler_bench.json"
throughput zero_memory 60 --recipes random --checkpointing 0 --micro_batches "${MICROS[@]}" \
    --zero 0 2 --steps 2 --warmup 1
throughput max_micro_batch 150 --find_max_micro_batch --checkpointing 0 1 \
    --micro_batches "$MICRO" --max_micro_batch "$CAP" --zero 2
throughput fused_adam 150 --recipes random --adam "${ADAMS[@]}" --checkpointing 0 \
    --micro_batches "$MICRO" --zero 2 --steps "$STEPS" --warmup "$WARMUP"

# With --previous, this run's steps replace that file's, the rest stay.
"$PYTHON" scripts/gpu_report.py collect "$RAW" "$OUT" --rehearsal "$CPU" \
    ${PREVIOUS:+--previous "$PREVIOUS"} \
    && "$PYTHON" scripts/gpu_report.py render "$OUT"
report_rc=$?
if grep -qv '"status": "ok"' "$RAW/steps.jsonl" || [ "$report_rc" -ne 0 ]; then
    echo "gpu_check: some steps did not succeed (see $OUT/gpu_check.md and $LOG)"
    exit 1
fi
echo "gpu_check: every step succeeded in $SECONDS s; results in $OUT"
