#!/usr/bin/env bash
# One short GPU check (under 8 minutes on one H100/H200), with no model hub and no vLLM:
#   bash bench/gpu_check.sh                   # random 0.40B Qwen2-shaped model in bf16 on CUDA
#   bash bench/gpu_check.sh --cpu-dry-run     # tiny sizes on a CPU: check the script before spending GPU time
# Any other flag goes to bench/gpu_check.py (--help lists them). Results: outputs/gpu-check/gpu_check.json.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1 PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"
if [[ " $* " != *" --cpu-dry-run "* ]]; then
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
if ! err=$(python -c "import tandem_grpo" 2>&1); then
    echo "error: tandem_grpo is not importable (${err##*$'\n'}): pip install -e . first" >&2; exit 2
fi
exec python bench/gpu_check.py "$@"
