#!/usr/bin/env bash
# GPU check of the commands users run (one H200, <= 10 minutes; torch, transformers, sentence-transformers and
# this tree, data from the repo's bundled books only). In one run, results as JSON under $OUT:
#   loop_eager.json     `bertforge pretrain` (run_pretraining, defaults: bf16, fused AdamW, workers) against
#                       the bare eager step on the same model and batches, and transformers' bare step
#   loop_compiled.json  the same with --compile against the compiled bare step
#   loop_packed.json    the same with --compile --pack-sequences
#   embed_lines.json    embed 40,000 book lines, MiniLM-size model, against sentence-transformers fp16 / fp32
#   embed_paragraphs.json  6-line paragraphs, base-size model, the same
#   summary.json        the ratios above in one place
# Usage (from the repo root): OUT=/some/dir bash benchmarks/gpu_check.sh [--device cpu]
# --device cpu is a dry run with tiny sizes (minutes on a laptop): it checks the script, not the speed.
set -uo pipefail
DEVICE=cuda
if [ "${1:-}" = "--device" ]; then DEVICE=${2:?--device needs cuda or cpu}; fi
OUT=${OUT:-runs/gpu_check}
WORK=${WORK:-$OUT/work}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "$DEVICE" = "cpu" ]; then
  LOOP="--device cpu --preset tiny --batch-size 8 --steps 12 --log-every 4 --repeats 1 --precision fp32"
  EMBED="--device cpu --texts 200 --batch-size 32 --max-batch-tokens 2048"; MINILM=tiny; BASE=tiny; T=600
else
  LOOP="--device cuda --preset base --batch-size 256 --steps 100 --log-every 20 --repeats 1 --precision bf16"
  EMBED="--device cuda --texts 40000"; MINILM=minilm; BASE=base; T=200
fi
python - <<'PY' 2>&1 | tee "$OUT/env.txt"
import platform, torch, transformers, sentence_transformers
print("torch", torch.__version__, "transformers", transformers.__version__, "sentence-transformers",
      sentence_transformers.__version__, "python", platform.python_version())
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
PY
date -u +"%Y-%m-%d %H:%M UTC" >> "$OUT/env.txt"
status=0
run() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  echo "== $name"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1 || { echo "   $name failed (see $name.log)"; status=1; }
  tail -3 "$OUT/$name.log"
}
run loop_eager "$T" python -m benchmarks.loop_overhead --what loop $LOOP --transformers --work "$WORK" \
  --out "$OUT/loop_eager.json"
run loop_compiled "$T" python -m benchmarks.loop_overhead --what loop $LOOP --compile --work "$WORK" \
  --out "$OUT/loop_compiled.json"
run loop_packed "$T" python -m benchmarks.loop_overhead --what loop $LOOP --compile --pack --work "$WORK" \
  --out "$OUT/loop_packed.json"
run embed_lines "$T" python -m benchmarks.embed_speed $EMBED --size "$MINILM" --kind lines --work "$WORK" \
  --out "$OUT/embed_lines.json"
run embed_paragraphs "$T" python -m benchmarks.embed_speed $EMBED --size "$BASE" --kind paragraphs \
  --texts "$([ "$DEVICE" = cpu ] && echo 100 || echo 6667)" --work "$WORK" --out "$OUT/embed_paragraphs.json"
python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def read(name):
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None
summary = {}
for name in ("loop_eager", "loop_compiled", "loop_packed"):
    result = read(name)
    if result:
        loop = result["loop"]
        summary[name] = {k: loop[k] for k in ("ratio_command_to_bare", "ratio_command_to_transformers") if k in loop}
for name in ("embed_lines", "embed_paragraphs"):
    result = read(name)
    if result:
        summary[name] = {k: result[k] for k in ("ratio_to_st_fp16", "ratio_to_st_fp32", "min_cosine_to_fp32",
                                                "ours_texts_per_s") if k in result}
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps(summary, indent=1))
PY
rm -rf "$WORK"/run-*/checkpoint-*
exit $status
