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
timeout 300 python3 benchmarks/gpu_fp8.py --json "$OUT/fp8.json" 2>&1 | tee "$OUT/fp8.log"
fp8=${PIPESTATUS[0]}
timeout 180 python3 benchmarks/gpu_megatron.py --json "$OUT/megatron.json" 2>&1 | tee "$OUT/megatron.log"
megatron=${PIPESTATUS[0]}
echo "fp8 rc=$fp8 megatron rc=$megatron"
exit $(( fp8 != 0 || megatron != 0 ))
