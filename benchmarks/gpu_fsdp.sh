#!/usr/bin/env bash
# One device call for issue 11's GPU check (bf16 FSDP2 on one GPU with CPU offload and
# activation checkpointing; peak RSS of prepare with cpu_ram_efficient_loading), results in $OUT.
# The device image has torch; hasten runs from src/. In one `run` call (no carry needed):
#   bash benchmarks/gpu_fsdp.sh          (timeout_s: 300)
set -u
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/hasten-gpu-out}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
status=0
for case in train loading; do
    timeout 120 python3 -m hasten.commands.cli launch --num_processes 1 --use_fsdp \
        benchmarks/gpu_fsdp.py --case "$case" --json "$OUT/fsdp_$case.json" 2>&1 \
        | tee -a "$OUT/fsdp.log"
    rc=${PIPESTATUS[0]}
    echo "fsdp $case rc=$rc" | tee -a "$OUT/fsdp.log"
    [ "$rc" -eq 0 ] || status=1
done
exit $status
