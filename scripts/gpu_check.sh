#!/usr/bin/env bash
# Every GPU figure of docs/benchmarks.md on one CUDA machine, in two commands of at most ten
# minutes each. The machine may be bare and offline (Python 3.12 with a CUDA build of torch,
# nvcc and ninja): what advpt needs beyond that is installed from wheels made beforehand by
# scripts/gpu_wheels.sh (see scripts/gpu_wheels.txt).
#
#   bash scripts/gpu_check.sh stage1   install; CUDA tests; short GPU quickstarts (alternating
#                                      bf16, simultaneous fp16, importance bf16); sampler benchmark
#   bash scripts/gpu_check.sh stage2   install; throughput benchmark: MFU, cost_vs_random of both
#                                      schedules, largest micro-batch with and without activation
#                                      checkpointing, peak memory at ZeRO 0 and 2, tokens/s at a
#                                      4,096-sequence global batch
#   bash scripts/gpu_check.sh report   gpu_check.json and gpu_check.md from the stages' files
#
# Options:
#   --out DIR     results (default runs/gpu_check in the checkout): STAGE.json (everything a
#                 stage measured), STAGE.log, and gpu_check.json + gpu_check.md (all stages
#                 found in DIR; the table is the one docs/benchmarks.md takes)
#   --wheels DIR  where the wheels are (default wheels/ in the checkout); a relative DIR, here
#                 and for --out, is taken from the current directory
#   --no-install  use the environment as it is (advpt's dependencies already installed)
#   --install     install from the wheels with --cpu too
#   --only STEPS  run only these steps of the stage (comma-separated; to re-run one that failed):
#                 stage1: cuda_tests, quickstart_alternating_bf16, quickstart_simultaneous_fp16,
#                 quickstart_importance_bf16, sampler_bench; stage2: throughput_cost,
#                 throughput_mfu, global_batch, max_micro_batch
#   --cpu         a rehearsal on the CPU with tiny sizes (and, unless --install, no install): it
#                 runs every step of the stage the way the GPU run does, but its numbers are no
#                 GPU figures
#
# Each step runs under a time limit, and the stage under a deadline (STAGE_SECONDS, default 570)
# so that it ends within ten minutes; a step that fails or runs out of time is recorded and the
# next one still runs. The exit status is 1 if any step did not succeed, 2 for a usage error or a
# missing wheel. Build caches (installed packages, run directories and, on a GPU, JIT-compiled ops
# unless TORCH_EXTENSIONS_DIR says otherwise) go to GPU_CHECK_CACHE (default
# runs/gpu_check_cache), so a second stage on the same machine reuses the first one's builds.
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

STAGE="${1:-}"
[ $# -gt 0 ] && shift
OUT=runs/gpu_check
WHEELS=wheels
INSTALL=""
CPU=0
ONLY=""
STEPS_OF_stage1="cuda_tests quickstart_alternating_bf16 quickstart_simultaneous_fp16"
STEPS_OF_stage1+=" quickstart_importance_bf16 sampler_bench"
STEPS_OF_stage2="throughput_cost throughput_mfu global_batch max_micro_batch"
while [ $# -gt 0 ]; do
    case "$1" in
        --out) [ $# -ge 2 ] || die "--out needs a directory"; OUT="$(from_caller "$2")"; shift 2 ;;
        --wheels) [ $# -ge 2 ] || die "--wheels needs a directory"; WHEELS="$(from_caller "$2")"
            shift 2 ;;
        --only) [ $# -ge 2 ] || die "--only needs step names"; ONLY="${2//,/ }"; shift 2 ;;
        --no-install) INSTALL=0; shift ;;
        --install) INSTALL=1; shift ;;
        --cpu) CPU=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown option '$1' (see bash scripts/gpu_check.sh --help)" ;;
    esac
done
case "$STAGE" in
    stage1 | stage2 | report) ;;
    -h | --help) usage; exit 0 ;;
    *) die "the first argument must be stage1, stage2 or report, not '$STAGE' (see --help)" ;;
esac
if [ -n "$ONLY" ]; then
    [ "$STAGE" = report ] && die "--only selects steps of stage1 or stage2"
    steps_of="STEPS_OF_$STAGE"
    for name in $ONLY; do
        [[ " ${!steps_of} " == *" $name "* ]] \
            || die "$STAGE has no step '$name'; its steps: ${!steps_of}"
    done
fi

# The wheels of scripts/gpu_wheels.txt in $WHEELS, one per pin, into WHEEL_FILES; before
# anything is written, so that a missing wheel stops the stage with nothing half-done.
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
    # ninja would compile its JIT ops (FusedAdam) again.
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
[ "$INSTALL" = 1 ] && [ "$STAGE" != report ] && find_wheels
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
if [ "$STAGE" = report ]; then
    exec "$PYTHON" scripts/gpu_report.py render "$OUT"
fi

CACHE="${GPU_CHECK_CACHE:-runs/gpu_check_cache}"
mkdir -p "$CACHE"
CACHE="$(cd "$CACHE" && pwd)"
RAW="$CACHE/$STAGE"
rm -rf "$RAW"
mkdir -p "$RAW"
: >"$RAW/steps.jsonl"
LOG="$OUT/$STAGE.log"
: >"$LOG"
exec > >(tee -a "$LOG") 2> >(tee -a "$LOG" >&2)
DEADLINE=$((SECONDS + ${STAGE_SECONDS:-570}))
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export GPU_CHECK_CPU="$CPU"
if [ "$CPU" = 1 ]; then # CPU ops build where every other CPU run finds them
    export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1
elif [ -z "${TORCH_EXTENSIONS_DIR:-}" ]; then
    export TORCH_EXTENSIONS_DIR="$CACHE/torch_extensions"
    # A build stopped by a step's time limit leaves its lock, and the next build of that op
    # would wait on it for ever; only gpu_check builds here, one step at a time.
    find "$TORCH_EXTENSIONS_DIR" -name lock -type f -delete 2>/dev/null
fi

# ------------------------------------------------------------------------------ install

# ------------------------------------------------------------------------------ steps

# step NAME LIMIT COMMAND...: run COMMAND for at most LIMIT seconds (less if the stage's
# deadline is nearer) and record its name, status and time in $RAW/steps.jsonl.
step() {
    local name="$1" limit="$2" status start rc
    shift 2
    if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then
        return
    fi
    local left=$((DEADLINE - SECONDS - 20)) # 20 s kept for the report
    start=$SECONDS
    if [ "$left" -lt 15 ]; then
        status=skipped
        rc=-1
        echo "=== [$name] skipped: the stage's deadline is near"
    else
        [ "$limit" -gt "$left" ] && limit=$left
        echo "=== [$name] (limit ${limit} s) $*"
        timeout --kill-after=10 "$limit" "$@"
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
        "$PYTHON" -c "from deepspeed.env_report import main; main()"
    fi
    "$PYTHON" - <<'EOF'
import json, os, subprocess, time
import torch
info = {
    "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    "torch": torch.__version__, "cuda": torch.version.cuda,
    "device": "CPU" if os.environ["GPU_CHECK_CPU"] == "1" else torch.cuda.get_device_name(),
    "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip() or "unknown",
}
try:
    import deepspeed
    info["deepspeed"] = deepspeed.__version__
except ImportError as error:
    info["deepspeed"] = f"not importable: {error}"
print(json.dumps(info, indent=2))
with open(os.path.join(os.environ["RAW"], "environment.json"), "w") as file:
    json.dump(info, file)
EOF
}

quickstart() { # quickstart NAME ENCODER_CONFIG [train.py flags]: a short real pre-training run
    local name="$1" config="$2"
    shift 2
    step "quickstart_$name" "$QUICKSTART_LIMIT" "$PYTHON" -m advpt.train \
        --deepspeed_config "$config" --noiser_deepspeed_config "$NOISER_CONFIG" \
        "${QUICKSTART[@]}" --run_dir "$RAW/quickstart-$name" "$@"
}

if [ "$CPU" = 1 ]; then # tiny sizes, CPU configs (fp16 does not run on a CPU: bf16 instead)
    BF16_CONFIG=cpu-bf16
    FP16_CONFIG=cpu-bf16
    NOISER_CONFIG=cpu
    QUICKSTART=(--encoder tiny --noiser tiny --max_length 64 --max_steps 4 --warmup_steps 1
        --noiser_steps 2 --encoder_steps 2 --log_every 2 --eval_every 4 --val_max_batches 2
        --checkpoint_every 4 --num_workers 1)
    QUICKSTART_LIMIT=120
    SAMPLER=(--quick --device cpu --repeats 1)
    BENCH=(--cpu --preset tiny --max_length 64 --workers 1)
    MICRO=8 MICROS=(8 16) GLOBAL=32 CAP=(--max_micro_batch 16)
else # the paper's sizes and the GPU configs
    BF16_CONFIG=gpu-bf16
    FP16_CONFIG=gpu-fp16
    NOISER_CONFIG=gpu
    QUICKSTART=(--encoder tape-base --noiser paper --max_length 512 --max_steps 20
        --warmup_steps 5 --log_every 5 --eval_every 20 --val_max_batches 8 --checkpoint_every 20
        --num_workers 2)
    QUICKSTART_LIMIT=150
    SAMPLER=()
    BENCH=(--preset tape-base --max_length 512 --precisions bf16 --workers 4)
    MICRO=32 MICROS=(32 64 128) GLOBAL=4096 CAP=(--max_micro_batch 4096)
fi

[ "$INSTALL" = 1 ] && install_wheels
export RAW
environment
BUILD_OPS="from advpt.kernels import load_subset_sampler
assert load_subset_sampler() is not None, 'the fused sampler did not build'
from deepspeed.ops.op_builder import FusedAdamBuilder
FusedAdamBuilder().load()"
if [ "$CPU" = 0 ]; then # compile the fused sampler and FusedAdam once, up front (--only too)
    ONLY="${ONLY:+$ONLY build_ops}" step build_ops 240 "$PYTHON" -c "$BUILD_OPS"
fi

if [ "$STAGE" = stage1 ]; then
    step cuda_tests 300 "$PYTHON" -m pytest -q -rs -p no:cacheprovider \
        tests/test_sampler_kernel.py tests/test_masking.py tests/test_dry_run.py \
        --junitxml "$RAW/tests.xml"
    quickstart alternating_bf16 "$BF16_CONFIG"
    quickstart simultaneous_fp16 "$FP16_CONFIG" --schedule simultaneous
    quickstart importance_bf16 "$BF16_CONFIG" --estimator importance
    step sampler_bench 180 "$PYTHON" scripts/bench_sampler.py "${SAMPLER[@]}" \
        --json "$RAW/sampler.json"
else
    step throughput_cost 150 "$PYTHON" scripts/bench_throughput.py "${BENCH[@]}" \
        --modes random alternating simultaneous --checkpointing 0 --micro_batches "$MICRO" \
        --zero 2 --steps 20 --warmup 10 --json "$RAW/throughput_cost.json"
    step throughput_mfu 180 "$PYTHON" scripts/bench_throughput.py "${BENCH[@]}" \
        --modes random --checkpointing 0 1 --micro_batches "${MICROS[@]}" --zero 0 2 \
        --steps 10 --warmup 5 --json "$RAW/throughput_mfu.json"
    step global_batch 90 "$PYTHON" scripts/bench_throughput.py "${BENCH[@]}" \
        --modes random --checkpointing 0 --micro_batches "$((MICRO * 2))" \
        --global_batch "$GLOBAL" --zero 2 --steps 2 --warmup 1 --json "$RAW/global_batch.json"
    step max_micro_batch 200 "$PYTHON" scripts/bench_throughput.py "${BENCH[@]}" \
        --find_max_micro_batch --checkpointing 0 1 --micro_batches "$((MICRO * 2))" \
        "${CAP[@]}" --zero 2 --json "$RAW/max_micro_batch.json"
fi

# With --only, the steps run now replace those of the stage's earlier results, the rest stay.
"$PYTHON" scripts/gpu_report.py collect "$STAGE" "$RAW" "$OUT" --rehearsal "$CPU" \
    ${ONLY:+--merge} \
    && "$PYTHON" scripts/gpu_report.py render "$OUT"
report_rc=$?
if grep -qv '"status": "ok"' "$RAW/steps.jsonl" || [ "$report_rc" -ne 0 ]; then
    echo "gpu_check: $STAGE: some steps did not succeed (see $OUT/gpu_check.md and $LOG)"
    exit 1
fi
echo "gpu_check: $STAGE: every step succeeded; results in $OUT"
