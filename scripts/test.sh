#!/usr/bin/env bash
# Set up the environment, then run the test suite (what CI runs).
#
#   bash scripts/test.sh [pytest args]
export ADVPT_EXTRAS=dev
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
ruff check .
ruff format --check .
python -m pytest -q "$@"
