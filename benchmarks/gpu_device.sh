#!/usr/bin/env bash
# One device call for issue 14: the fp8 (torchao) and Megatron-LM GPU checks, results in $OUT.
#
# The device image has torch but neither torchao nor megatron-core: fetch their wheels first,
# here (see benchmarks/gpu_fetch_wheels.sh), and carry `.whl`. Then, in one `run` call:
#   bash benchmarks/gpu_device.sh          (carry: [".whl"], timeout_s: 540)
set -u
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 3
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/hasten-gpu-out}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
timeout 240 python3 benchmarks/gpu_fp8.py --json "$OUT/fp8.json" 2>&1 | tee "$OUT/fp8.log"
fp8=${PIPESTATUS[0]}
# Megatron-LM: one process per case (GPT, the dummy loader over an indexed dataset, BERT, T5,
# fp8 when Transformer Engine is there); all logs in one file, the cases' results in one JSON
# ($OUT brings back at most 8 files).
megatron=0
for case in gpt dummy t5 bert fp8; do
    timeout 90 python3 benchmarks/gpu_megatron.py --case "$case" --json "/tmp/megatron_$case.json" \
        2>&1 | tee -a "$OUT/megatron.log"
    rc=${PIPESTATUS[0]}
    echo "megatron $case rc=$rc" | tee -a "$OUT/megatron.log"
    [ "$rc" -eq 0 ] || megatron=1
done
python3 -c 'import glob, json, sys; json.dump({p: json.load(open(p)) for p in sorted(glob.glob("/tmp/megatron_*.json"))}, open(sys.argv[1], "w"), indent=2)' "$OUT/megatron.json"
echo "fp8 rc=$fp8 megatron rc=$megatron"
exit $(( fp8 != 0 || megatron != 0 ))
