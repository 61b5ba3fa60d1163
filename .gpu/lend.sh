# The prepared script for the next lent GPU (issue 55; made 2026-11-28 at 38daa7c, when no machine was lent; part b,
# the 8B unit, added the same day): one call at the commit named by $1, `bash .gpu/lend.sh <sha> a 590 560` then at
# once `bash .gpu/lend.sh <sha> b <left> <left-30>` (campaign stage 6: resumable, a later call finishes it), and on a
# later loan part c.
# PART a = environment, stage 1 (every cuda
# test with the worker's isolation test and the attention at BERT-Large's head shape, counted against measured, L2L's
# microbenchmarks). PART b = campaign stage 6 (docs/gpu-campaign.md: its precounts, `make gpu-precount STAGE=6`,
# committed at the same code). PART c = the probe of the counted-against-measured gap (tests/probes/cuda_peak_sites.py: what the
# allocator holds at the peak of the three rows that missed their bound on 2026-11-27), then Table 6's paper section (one round, a memory question: the widest Turing-NLG-like model this host holds, L2L-CMP under 16 GiB),
# in a fresh process (the worker's pool would keep the pristine model on the host beside the run), then
# bench-host-optim's layer rows. Each step under min(its limit, time left), SIGINT first (a sweep keeps its finished
# rounds).
set -u
export PYTHONPATH=. SUITE_COMMIT="$1" SUITE_DIRTY=0 PYTHONUNBUFFERED=1
PART=$2 BUDGET=$3
START=$(date +%s); touch /tmp/lend-stamp-$PART
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
step() {  # step NAME MAX_S CMD...
  local name=$1 max=$2; shift 2
  local l=$(left); local t=$(( max < l ? max : l ))
  if [ "$t" -lt 30 ]; then echo "== $name: skipped, ${l}s left"; return 99; fi
  echo "== $name (limit ${t}s) at +$(( $(date +%s) - START ))s"
  timeout -s INT -k 20 "$t" "$@" > "$OUT/$PART-$name.log" 2>&1; local rc=$?
  tail -n 24 "$OUT/$PART-$name.log"; echo "== $name rc=$rc at +$(( $(date +%s) - START ))s"; return $rc
}
if [ "$PART" = a ]; then
  { python -c "import torch, triton, transformers, numpy, platform; print(platform.python_version(), torch.__version__, triton.__version__, transformers.__version__, numpy.__version__, torch.cuda.get_device_name())"
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv,noheader; nproc; free -g | head -2; } | tee "$OUT/env.txt"
  step stage1 "$4" python -m suite campaign --stage 1 --budget $(( $4 - 25 )) --out ""
fi
if [ "$PART" = b ]; then  # the 8B unit (issues 54, 63): bench-link, L2L-CMP at 8B with AdamW on the host and on the device
  step stage6 "$4" python -m suite campaign --stage 6 --budget $(( $4 - 25 )) --out ""
fi
if [ "$PART" = c ]; then
  step peaksites 120 python tests/probes/cuda_peak_sites.py "$OUT/peak-sites.json" baseline-amp l2l-fp32 l2l-cmp baseline-fp32
  step table6 "$4" python -m suite run table6 --profile paper --wandb off
  step hostoptim 120 python -m suite run bench-host-optim --profile paper --only 'layer-*' --wandb off
fi
find results -newer /tmp/lend-stamp-$PART -type f ! -name '.*' | grep -v '/\.cache/' > /tmp/changed
tar czf "$OUT/records-$PART.tgz" -T /tmp/changed
wc -l < /tmp/changed; ls -la "$OUT"; echo "total $(( $(date +%s) - START ))s"
