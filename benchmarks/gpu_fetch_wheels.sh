#!/usr/bin/env bash
# Fetch, on this machine, the wheels the device image lacks (it runs Python 3.12, torch 2.11):
# torchao (pure-Python parts + CUDA kernels) and megatron-core. Pick a torchao release built for
# the device's torch (TORCHAO=...); 0.18 is the one tested on CPU here with torch 2.13.
set -eu
TORCHAO="${TORCHAO:-0.18.0}"
MCORE="${MCORE:-0.16.1}"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> "$(git rev-parse --git-common-dir)/info/exclude"
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
    -d .whl "torchao==$TORCHAO" "megatron-core==$MCORE"
ls -la .whl
