#!/usr/bin/env bash
# Set up the environment, then run the tests (docs/testing.md).
#
#   bash scripts/test.sh [pytest args]          every test, what CI runs (.ci/run), on 2 workers
#   bash scripts/test.sh --fast [pytest args]   the fast tier: no slow, process or multirank
#                                               test, and none may use over 10 s of CPU
# Both list the 30 slowest tests at the end.
export ADVPT_EXTRAS=dev
source "$(dirname "${BASH_SOURCE[0]}")/setup_eval.sh"
ruff check .
ruff format --check .
# Every test runs on two workers (pytest-xdist), one per core of a 2-core CI machine; set
# ADVPT_TEST_WORKERS for more. The fast tier runs in one process; its 10 s limit is of the
# CPU a test uses, whatever else the machine runs.
workers=(-n "${ADVPT_TEST_WORKERS:-2}" --dist load --maxschedchunk 1)
case " $* " in *" --fast "* | *" -n "* | *" --numprocesses"*) workers=() ;; esac
python -m pytest -q --durations=30 "${workers[@]}" "$@"
