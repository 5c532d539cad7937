# Sourced by quickstart.sh and test.sh: a Python environment with torch, DeepSpeed and advpt.
#
# Which environment, in this order:
#   1. the active virtual environment or conda environment (not conda's base): used as it is;
#   2. otherwise .venv in the repo. When the system's python3 already imports torch (an NGC
#      container, a cluster module), .venv is made with --system-site-packages so that this
#      torch, with its CUDA build, is the one used.
# torch is never replaced: advpt and its dependencies are installed with the importable torch
# pinned to its own version. Only when none is importable is torch installed, from
# ADVPT_TORCH (default torch==2.13.0), split into words so that it can carry pip options:
#   ADVPT_TORCH="torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124"
# ADVPT_EXTRAS names advpt's extras to install (quickstart: hf,parquet,plots; test.sh: dev).
set -euo pipefail

ADVPT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ADVPT_ROOT"
ADVPT_EXTRAS="${ADVPT_EXTRAS:-hf,parquet,plots}"

if [ -n "${VIRTUAL_ENV:-}" ]; then
    ADVPT_ENV="$VIRTUAL_ENV"
elif [ -n "${CONDA_PREFIX:-}" ] && [ "${CONDA_DEFAULT_ENV:-base}" != "base" ]; then
    ADVPT_ENV="$CONDA_PREFIX"
else
    if [ ! -x .venv/bin/python ]; then
        if python3 -c "import torch" >/dev/null 2>&1; then
            echo "[advpt] creating .venv on top of the system's torch $(python3 -c \
                'import torch; print(torch.__version__)' 2>/dev/null) (--system-site-packages)"
            python3 -m venv --system-site-packages .venv
        else
            echo "[advpt] creating virtual environment .venv"
            python3 -m venv .venv
        fi
    fi
    # shellcheck disable=SC1091
    source .venv/bin/activate
    ADVPT_ENV="$VIRTUAL_ENV"
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! python -c "import torch" >/dev/null 2>&1; then
    read -r -a torch_spec <<<"${ADVPT_TORCH:-torch==2.13.0}"
    echo "[advpt] installing ${torch_spec[*]}"
    python -m pip install --quiet "${torch_spec[@]}"
fi
stamp="$ADVPT_ENV/.advpt-installed-$ADVPT_EXTRAS"
if ! python -c "import advpt, deepspeed" >/dev/null 2>&1 || [ ! -e "$stamp" ] \
    || [ pyproject.toml -nt "$stamp" ]; then
    echo "[advpt] installing advpt[$ADVPT_EXTRAS] and its dependencies (keeping torch" \
        "$(python -c 'import torch; print(torch.__version__)' 2>/dev/null))"
    pin="$(mktemp)"
    python -c 'import torch; print(f"torch=={torch.__version__}")' 2>/dev/null >"$pin"
    python -m pip install --quiet --constraint "$pin" -e ".[$ADVPT_EXTRAS]"
    rm -f "$pin"
    touch "$stamp" 2>/dev/null || true
fi

# Without a GPU, DeepSpeed runs on the CPU accelerator (gloo, CPU configs).
if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    ADVPT_GPUS="$(python -c "import torch; print(torch.cuda.device_count())")"
else
    ADVPT_GPUS=0
    export DS_ACCELERATOR=cpu
fi
export ADVPT_GPUS

# The C++ op every run of this machine needs (DeepSpeed's CPU collectives; on a GPU, the fused
# sampler), built once per environment into a folder of its own (advpt/native_builds.py): no run
# pays the build or can be killed inside it, and another environment never rebuilds it.
ops_stamp="$ADVPT_ENV/.advpt-extensions-built-$ADVPT_GPUS"
if [ ! -e "$ops_stamp" ] || [ "$stamp" -nt "$ops_stamp" ]; then
    echo "[advpt] building the C++ op this machine's runs use (once per environment)"
    python -m advpt build-extensions
    touch "$ops_stamp" 2>/dev/null || true
fi
