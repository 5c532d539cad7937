#!/usr/bin/env bash
# Set up the environment, then run the tests (docs/testing.md).
#
#   bash scripts/test.sh [pytest args]          every test, what CI runs (.ci/run)
#   bash scripts/test.sh --fast [pytest args]   the fast tier: no slow, process or multirank
#                                               test, and none may take over 10 s
# Both list the 30 slowest tests at the end.
export ADVPT_EXTRAS=dev
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
ruff check .
ruff format --check .
python -m pytest -q --durations=30 "$@"
