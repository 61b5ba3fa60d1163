# One lent-GPU call: kernels' cuda tests, then the targets' measurements, most valuable first, inside a deadline.
set -u
export PYTHONPATH=. SUITE_COMMIT="$1" SUITE_DIRTY=0
BUDGET=${2:-480}
START=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
step() {  # step NAME MAX_S CMD...: run CMD under min(MAX_S, time left), log to $OUT/NAME.log
  local name=$1 max=$2; shift 2
  local l=$(left); local t=$(( max < l ? max : l ))
  if [ "$t" -lt 20 ]; then echo "== $name: skipped, ${l}s left"; return 99; fi
  echo "== $name (limit ${t}s) at +$(( $(date +%s) - START ))s"
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  tail -n 12 "$OUT/$name.log"; echo "== $name rc=$rc at +$(( $(date +%s) - START ))s"; return $rc
}
python -c "import torch, triton, transformers, numpy, platform; print(platform.python_version(), torch.__version__, triton.__version__, transformers.__version__, numpy.__version__, torch.cuda.get_device_name())" | tee "$OUT/env.txt"
SUITE_TRITON_TUNE=0 step cuda-tests 170 python -m pytest -q -rs -m cuda -p no:cacheprovider --junitxml="$OUT/cuda-tests.xml" \
  tests/test_cuda_kernels.py tests/test_device_lamb.py tests/test_cuda.py
step cuda-tests-tuned 70 python -m pytest -q -rs -m cuda -p no:cacheprovider -k "bert_large and dtype0" tests/test_cuda_kernels.py
step bench-overhead 160 python -m suite run bench-overhead --profile paper --only 'table3-*' --force --wandb off
step table3 220 python -m suite run table3 --profile paper --only amp-rc-u1 --only amp-rc-u4 --only l2l-cmp-u1 --only l2l-cmp-u4 --rounds 1 --force --wandb off
step bench-overhead-t2 60 python -m suite run bench-overhead --profile paper --only amp-vs-hf --force --wandb off
step profile 45 python .gpu/profile_step.py
tar czf "$OUT/results.tgz" results/runs/h100-79gb results/bench-overhead*.md results/table3.md results/table3.csv 2>/dev/null
ls -la "$OUT"; echo "total $(( $(date +%s) - START ))s"
