#!/usr/bin/env bash
# One short GPU check, with no model hub:
#   bash bench/gpu_check.sh                   # random 0.40B Qwen2-shaped model in bf16 on CUDA (under 8 minutes),
#                                             # then, where vLLM is installed, `tandem-grpo check` of the tandem
#                                             # engine: compiled, async scheduling, sleep level 2 (tiny models, a
#                                             # named junior), and the 0.40B model in bf16
#   bash bench/gpu_check.sh --cpu-dry-run     # tiny sizes on a CPU: check the script before spending GPU time
# Any other flag goes to bench/gpu_check.py (--help lists them). Results: outputs/gpu-check/gpu_check.json and the
# JSON lines of each `tandem-grpo check`. Each part has its own time limit (seconds, overridable):
#   GPU_CHECK_TIMEOUT (600), VLLM_COMPILED_TIMEOUT (480), VLLM_ASYNC_TIMEOUT (300), VLLM_SLEEP_TIMEOUT (300),
#   VLLM_BF16_TIMEOUT (480).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1 PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
dry_run=0
[[ " $* " == *" --cpu-dry-run "* ]] && dry_run=1
if [[ $dry_run == 0 ]]; then
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
if ! err=$(python -c "import tandem_grpo" 2>&1); then
    echo "error: tandem_grpo is not importable (${err##*$'\n'}): pip install -e . first" >&2; exit 2
fi
status=0
timeout -k 30 "${GPU_CHECK_TIMEOUT:-600}" python bench/gpu_check.py "$@" || status=$?
if [[ $dry_run == 1 ]]; then
    # The vLLM parts need a GPU (vLLM's CPU build runs Model Runner V1 only): checked for syntax here.
    python -m py_compile bench/gpu_check_vllm.py && echo "bench/gpu_check_vllm.py compiles (vLLM parts not run)"
    exit $status
fi
if ! python -c "import vllm" >/dev/null 2>&1; then
    echo "vLLM is not importable: the Model Runner V2 engine parts are skipped (pip install 'tandem-grpo[vllm]')."
    exit $status
fi
declare -A limit=([compiled]="${VLLM_COMPILED_TIMEOUT:-480}" [async]="${VLLM_ASYNC_TIMEOUT:-300}"
                  [sleep]="${VLLM_SLEEP_TIMEOUT:-300}" [bf16]="${VLLM_BF16_TIMEOUT:-480}")
mapfile -t tiny < <(python bench/gpu_check_vllm.py --workdir outputs/gpu-check/vllm)
declare -A flags=([compiled]="--model ${tiny[0]} --junior-model ${tiny[1]} --dtype float32"
                  [async]="--model ${tiny[0]} --junior-model ${tiny[1]} --dtype float32 --enforce-eager --async-scheduling"
                  [sleep]="--model ${tiny[0]} --junior-model ${tiny[1]} --dtype float32 --enforce-eager --sleep"
                  [bf16]="--model outputs/gpu-check/model --dtype bfloat16")
for part in compiled async sleep bf16; do
    if [[ $part == bf16 && ! -f outputs/gpu-check/model/config.json ]]; then
        echo "== bf16: no outputs/gpu-check/model (bench/gpu_check.py writes it): skipped"; continue
    fi
    echo "== tandem-grpo check: $part (limit ${limit[$part]} s)"
    part_status=0
    # shellcheck disable=SC2086  # the flags are words
    timeout -k 30 "${limit[$part]}" python -m tandem_grpo.cli check ${flags[$part]} --gpu-memory-utilization 0.3 \
        --max-model-len 256 | tee "outputs/gpu-check/check-$part.jsonl" || part_status=$?
    if [[ $part_status != 0 ]]; then
        echo "== $part failed (exit $part_status; 124 = over its time limit)" >&2
        status=$part_status
    fi
done
exit $status
