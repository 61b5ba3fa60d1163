set -u
export PYTHONPATH=.
python -c "import torch, triton, transformers, numpy; print(torch.__version__, triton.__version__, transformers.__version__, numpy.__version__, torch.cuda.get_device_name())"
timeout 150 python -m pytest -q -m cuda tests/test_cuda_kernels.py -x -p no:cacheprovider 2>&1 | tail -25
timeout 90 python .gpu/attn_bench.py 2>&1 | tail -20
timeout 75 python -m suite run table3 --profile paper --only amp-rc-u1 --rounds 1 --force --wandb off 2>&1 | tail -5
