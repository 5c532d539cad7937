#!/usr/bin/env bash
# Make the wheels scripts/gpu_check.sh installs on a CUDA machine that has no network.
#
#   bash scripts/gpu_wheels.sh [DIR]        (default DIR: wheels/, ignored by git)
#
# Run it where pip reaches PyPI, in advpt's environment (it builds DeepSpeed's wheel with the
# torch installed there), then copy DIR to the GPU machine beside the checkout. Every package of
# scripts/gpu_wheels.txt is fetched for CPython WHEEL_PYTHON (default 3.12, the GPU machine's) on
# manylinux x86_64; DeepSpeed publishes only a source archive, which is built here into a
# pure-Python wheel with DS_BUILD_OPS=0: its CUDA ops (FusedAdam) then compile on first use
# there, with the machine's nvcc and ninja.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DIR="${1:-wheels}"
# advpt's environment: an active one, else the .venv the setup scripts make, else python3
if [ -z "${PYTHON:-}" ] && [ -z "${VIRTUAL_ENV:-}" ] && [ -x .venv/bin/python ]; then
    PYTHON=.venv/bin/python
fi
PYTHON="${PYTHON:-python3}"
WHEEL_PYTHON="${WHEEL_PYTHON:-3.12}"
mapfile -t PINS < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' -e 's/[[:space:]]//g' scripts/gpu_wheels.txt)
BINARY=()
SOURCE=""
for pin in "${PINS[@]}"; do
    if [ "${pin%%==*}" = deepspeed ]; then SOURCE="$pin"; else BINARY+=("$pin"); fi
done

mkdir -p "$DIR"
rm -f "$DIR"/*.whl  # one version of each: two would stop the install there
export PIP_DISABLE_PIP_VERSION_CHECK=1
# pip matches manylinux_2_N tags exactly, so name every tag a wheel may carry.
PLATFORMS=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
    manylinux1_x86_64; do
    PLATFORMS+=(--platform "$tag")
done
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version "$WHEEL_PYTHON" --implementation cp "${PLATFORMS[@]}" -d "$DIR" "${BINARY[@]}"

SDIST="$(mktemp -d)"
trap 'rm -rf "$SDIST"' EXIT
"$PYTHON" -m pip download --quiet --no-deps --no-binary=:all: -d "$SDIST" "$SOURCE"
DS_BUILD_OPS=0 "$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation -w "$DIR" \
    "$SDIST"/*.tar.gz

# The check gpu_check.sh's install will make: pip, asked for that CPython on manylinux, takes
# every pin from DIR alone.
"$PYTHON" -m pip install --quiet --dry-run --ignore-installed --no-deps --no-index \
    --find-links "$DIR" --only-binary=:all: --python-version "$WHEEL_PYTHON" --implementation cp \
    "${PLATFORMS[@]}" --target "$SDIST/target" "${PINS[@]}"

echo "[gpu_wheels] $(find "$DIR" -name '*.whl' | wc -l) wheels, $(du -sh "$DIR" | cut -f1), in $DIR:"
ls -1 "$DIR"
