# One lent-GPU call of issue 45 (2026-11-27): PART a = stage 1 then Table 3's shape against a user's loop;
# PART b = Table 2's relay variants (overlap on/off, the stash on the host). Each step under min(its limit, time left).
set -u
export PYTHONPATH=. SUITE_COMMIT="$1" SUITE_DIRTY=0
PART=$2 BUDGET=$3 WORKER=${4:-}
START=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
step() {  # step NAME MAX_S CMD...: CMD under min(MAX_S, time left), SIGINT first (a sweep keeps its finished rounds)
  local name=$1 max=$2; shift 2
  local l=$(left); local t=$(( max < l ? max : l ))
  if [ "$t" -lt 25 ]; then echo "== $name: skipped, ${l}s left"; return 99; fi
  echo "== $name (limit ${t}s) at +$(( $(date +%s) - START ))s"
  timeout -s INT -k 20 "$t" "$@" > "$OUT/$PART-$name.log" 2>&1; local rc=$?
  tail -n 14 "$OUT/$PART-$name.log"; echo "== $name rc=$rc at +$(( $(date +%s) - START ))s"; return $rc
}
if [ "$PART" = a ]; then
  { python -c "import torch, triton, transformers, numpy, platform; print(platform.python_version(), torch.__version__, triton.__version__, transformers.__version__, numpy.__version__, torch.cuda.get_device_name())"
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv,noheader; nproc; } | tee "$OUT/env.txt"
  step stage1 315 python -m suite campaign --stage 1 --budget 300
  step bench-overhead 260 python -m suite run bench-overhead --profile paper --only 'table3-*' --force --wandb off
else
  step table2 "$(left)" python -m suite run table2 --profile paper --only l2l-cmp --only l2l-cmp-overlap --only l2l-cmp-stash-cpu \
    --rounds 2 --force --wandb off $WORKER
fi
tar czf "$OUT/records-$PART.tgz" results/runs/h100-79gb results/campaign/h100-79gb results/bench-overhead*.md results/table2.md 2>/dev/null
ls -la "$OUT"; echo "total $(( $(date +%s) - START ))s"
