#!/usr/bin/env bash
# The Hugging Face libraries' own CPU test suites, run offline against real accelerate 1.15.0 and
# against hasten-as-accelerate, with the counts side by side (issue 20, part 4).
#
# Everything happens under $ECOSUITES_WORK (default /work/scratch/ecosuites), outside this
# repository; none of the other projects' code is ever copied into it.
#
#   scripts/ecosystem/suites.sh setup            # venvs, sources, hub stand-ins (once; ~15 min)
#   scripts/ecosystem/suites.sh run SUITE SIDE   # SUITE: trl | peft | peft-devicemap | diffusers
#                                                #        | transformers
#                                                # SIDE: accelerate | hasten
#   scripts/ecosystem/suites.sh compare [SUITE]  # counts side by side + every test that differs
#   scripts/ecosystem/suites.sh all              # setup, every suite on both sides, compare
#
# Sources: peft's tests come from its sdist (which ships tests/). trl's and diffusers' sdists ship
# no tests: give their git directories (the `fetch` tool's huggingface/trl and huggingface/diffusers)
# in TRL_GIT and DIFFUSERS_GIT; the tests are taken at TRL_REF / DIFFUSERS_REF. The newest stored
# trl snapshot predates 1.16, so trl runs as the released pair trl==1.9.0 + tag v1.9.0 (tests of
# another version fail to import). transformers' tests/trainer is in neither its sdist nor the
# huggingface/transformers snapshot this machine can fetch (over the size limit); ROCm/transformers,
# AMD's fork, can be fetched and carries upstream main on its `upstream_sync` branch. The transformers
# suite installs transformers from that same commit (TRANSFORMERS_REF), so library and tests match,
# in its own pair of venvs (venv-tf-accelerate, venv-tf-hasten).
#
# Test-environment adaptations, the same on both sides (each file says why):
#   hub_standins.py      tiny stand-ins for the hub models / data sets the suites load most
#   suite_plugin.py      use_cpu=True when there is no GPU (trl defaults to bf16); peft stays offline
#   torchvision_shim.py  lets the index's (CUDA-linked) torchvision import over the CPU torch wheel
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WORK=${ECOSUITES_WORK:-/work/scratch/ecosuites}
TRL_GIT=${TRL_GIT:-/work/.mirror/huggingface+trl/repo}
TRL_REF=${TRL_REF:-v1.9.0}
TRL_SPEC=${TRL_SPEC:-trl==1.9.0}
DIFFUSERS_GIT=${DIFFUSERS_GIT:-/work/.mirror/huggingface+diffusers/repo}
DIFFUSERS_REF=${DIFFUSERS_REF:-v0.40.0}
PEFT_VERSION=${PEFT_VERSION:-0.21.2}
TRANSFORMERS_GIT=${TRANSFORMERS_GIT:-/work/.mirror/ROCm+transformers/repo}
TRANSFORMERS_REF=${TRANSFORMERS_REF:-56c4b5e37f}   # upstream main, 5.0.1.dev0 (2026-02)
TIMEOUT=${ECOSUITES_TIMEOUT:-600}   # seconds per test
PKGS=(torch==2.13.0 transformers==5.24.0 "$TRL_SPEC" "peft==$PEFT_VERSION" diffusers==0.42.1
      datasets pytest pytest-timeout parameterized scipy torchvision sentencepiece tensorboard scikit-learn)

export HF_HOME="$WORK/hf" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1 WANDB_DISABLED=true WANDB_MODE=disabled
export CUDA_VISIBLE_DEVICES="" PYTHONPATH="$HERE"

# transformers' own test extras that tests/trainer and its conftest import.
TF_PKGS=(torch==2.13.0 datasets pytest pytest-timeout pytest-env parameterized timeout-decorator
         psutil dill evaluate tensorboard scikit-learn sentencepiece optuna)

SUITES="trl peft peft-devicemap diffusers transformers transformers-gated"

venv() { echo "$WORK/venv-$1"; }

make_venv() {  # side [tf]: the tf pair holds transformers built from TRANSFORMERS_REF
  local v; v=$(venv "${2:+$2-}$1")
  [[ -f "$v/.ready" ]] && return
  python3 -m venv "$v"
  "$v/bin/pip" install -q --upgrade pip
  "$v/bin/pip" install -q torch==2.13.0              # the local CPU wheel first
  if [[ -n ${2:-} ]]; then
    "$v/bin/pip" install -q "${TF_PKGS[@]}" "$WORK/src/transformers"
  else
    "$v/bin/pip" install -q "${PKGS[@]}"
  fi
  if [[ $1 == accelerate ]]; then
    "$v/bin/pip" install -q torch==2.13.0 accelerate==1.15.0
  else
    "$v/bin/pip" uninstall -y -q accelerate           # pulled in by trl / peft
    "$v/bin/pip" install -q torch==2.13.0 -e "$REPO"
    "$v/bin/hasten" accelerate install
  fi
  "$v/bin/python" -c "import torchvision" 2>/dev/null || "$v/bin/python" "$HERE/torchvision_shim.py" --install
  touch "$v/.ready"
}

setup() {
  mkdir -p "$WORK/src"
  mkdir -p "$WORK/src/transformers"
  [[ -f "$WORK/src/transformers/setup.py" ]] ||
    git -C "$TRANSFORMERS_GIT" archive "$TRANSFORMERS_REF" | tar x -C "$WORK/src/transformers"
  make_venv accelerate
  make_venv hasten
  make_venv accelerate tf
  make_venv hasten tf
  cd "$WORK/src"
  if [[ ! -d peft-$PEFT_VERSION ]]; then
    "$(venv accelerate)/bin/pip" download -q --no-deps --no-binary :all: "peft==$PEFT_VERSION" -d .
    tar xzf "peft-$PEFT_VERSION.tar.gz"
    touch "peft-$PEFT_VERSION/tests/__init__.py"   # its tests import each other relatively
  fi
  if [[ ! -d trl ]]; then
    mkdir trl && git -C "$TRL_GIT" archive "$TRL_REF" tests scripts | tar x -C trl
  fi
  if [[ ! -d diffusers ]]; then
    mkdir diffusers && git -C "$DIFFUSERS_GIT" archive "$DIFFUSERS_REF" examples tests | tar x -C diffusers
  fi
  "$(venv accelerate)/bin/python" "$HERE/hub_standins.py" --trl-repo "$WORK/src/trl" \
    --diffusers
}

# The selections. Each is one pytest command line, run from the suite's source folder.
suite_dir() {
  case $1 in
    trl) echo "$WORK/src/trl" ;;
    peft*) echo "$WORK/src/peft-$PEFT_VERSION" ;;
    diffusers*) echo "$WORK/src/diffusers" ;;
    transformers*) echo "$WORK/src/transformers" ;;
  esac
}
run() {  # suite side
  local dir v out args
  dir=$(suite_dir "$1"); v=$(venv "$2"); out="$WORK/results"
  [[ $1 == transformers* ]] && v=$(venv "tf-$2")
  case $1 in
    trl) args=(tests/test_sft_trainer.py tests/test_dpo_trainer.py tests/test_reward_trainer.py
               tests/test_grpo_trainer.py) ;;
    peft) args=(tests/test_integrations.py tests/test_tuners_utils.py) ;;
    # test_custom_models.py holds 19,485 tuner tests; these are its device-map / offload / hook ones.
    peft-devicemap) args=(tests/test_custom_models.py -k "device_map or offload or hook or dispatch or accelerate") ;;
    # The example tests whose hub models / data sets have stand-ins (hub_standins.py): 24 of 135.
    diffusers) args=(examples/unconditional_image_generation examples/text_to_image examples/textual_inversion
                     examples/dreambooth/test_dreambooth.py examples/dreambooth/test_dreambooth_lora.py
                     examples/custom_diffusion -k "not sdxl and not _if") ;;
    # Its tests run on CPU as written: no use_cpu patch (SUITE_USE_CPU=0 below).
    transformers) args=(tests/trainer) ;;
    # Its multi-device tests (skipped above), run as 2 CPU processes: SUITE_CPU_DEVICES=2 below.
    transformers-gated) args=(tests/trainer -k "Distributed or FSDP or multiple_accelerators or num_batches_in_training_with_gradient_accumulation or double_train_wrap_once") ;;
  esac
  # ECOSUITES_SELECT replaces the selection (pytest arguments, e.g. test ids) for a quicker run.
  [[ -n ${ECOSUITES_SELECT:-} ]] && read -r -a args <<< "$ECOSUITES_SELECT"
  mkdir -p "$out"
  cd "$dir"
  # diffusers' example tests start `accelerate launch`: the venv's own command comes first.
  SUITE_USE_CPU=$([[ $1 == transformers* ]] && echo 0 || echo 1) \
  SUITE_CPU_DEVICES=$([[ $1 == transformers-gated ]] && echo 2) \
  PATH="$v/bin:$PATH" "$v/bin/python" -m pytest -p no:cacheprovider -p suite_plugin -o addopts= \
    --timeout "$TIMEOUT" -q -rA --junitxml "$out/$1-$2.xml" "${args[@]}" > "$out/$1-$2.log" 2>&1 || true
  tail -n 1 "$out/$1-$2.log"
}

compare() {
  local s
  for s in ${1:-$SUITES}; do
    [[ -f "$WORK/results/$s-accelerate.xml" && -f "$WORK/results/$s-hasten.xml" ]] || continue
    "$(venv accelerate)/bin/python" "$HERE/compare.py" --name "$s" ${ECOSUITES_COMPARE_ARGS:-} \
      "$WORK/results/$s-accelerate.xml" "$WORK/results/$s-hasten.xml" || true
  done
}

case ${1:-} in
  setup) setup ;;
  run) run "$2" "$3" ;;
  compare) compare "${2:-}" ;;
  all)
    setup
    for s in $SUITES; do run "$s" accelerate; run "$s" hasten; done
    compare ;;
  *) sed -n '2,25p' "$0"; exit 2 ;;
esac
