# Sourced by quickstart.sh and test.sh: a Python environment with torch, DeepSpeed and advpt.
#
# Uses the active virtual environment if there is one, else creates/uses .venv in the repo.
# torch is installed only when none is importable; ADVPT_TORCH (default torch==2.13.0) says
# which. Set it to the build that matches your CUDA, or install torch yourself first.
set -euo pipefail

ADVPT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ADVPT_ROOT"

if [ -z "${VIRTUAL_ENV:-}" ]; then
    if [ ! -x .venv/bin/python ]; then
        echo "[advpt] creating virtual environment .venv"
        python3 -m venv .venv
    fi
    # shellcheck disable=SC1091
    source .venv/bin/activate
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! python -c "import torch" >/dev/null 2>&1; then
    echo "[advpt] installing ${ADVPT_TORCH:-torch==2.13.0}"
    python -m pip install --quiet "${ADVPT_TORCH:-torch==2.13.0}"
fi
if ! python -c "import advpt, deepspeed, pytest, ruff" >/dev/null 2>&1 \
    || [ pyproject.toml -nt "$VIRTUAL_ENV/.advpt-installed" ]; then
    echo "[advpt] installing advpt and its dependencies"
    python -m pip install --quiet -e ".[dev]"
    touch "$VIRTUAL_ENV/.advpt-installed" 2>/dev/null || true
fi

# Without a GPU, DeepSpeed runs on the CPU accelerator (gloo, CPU configs).
if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    ADVPT_GPUS="$(python -c "import torch; print(torch.cuda.device_count())")"
else
    ADVPT_GPUS=0
    export DS_ACCELERATOR=cpu
fi
export ADVPT_GPUS
