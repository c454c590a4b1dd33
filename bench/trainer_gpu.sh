#!/usr/bin/env bash
# What a lent GPU runs in one go (`device` tool, ~9 minutes): the throughput table with nanoGPT
# side by side, then the fastest settings' checks (curves, summary vs bench, exact resume).
# Needs nanoGPT's train.py, model.py, configurator.py in $NANOGPT_DIR (default .nanogpt) and, for
# the liger rows, liger-kernel importable (e.g. unpacked wheels on PYTHONPATH: .gpu-deps).
# Everything lands in ${OUT:-gpu-out}: gpu.txt, throughput.txt/.json, check.txt, logs/.
set -u
out=${OUT:-gpu-out}
mkdir -p "$out/logs"
[ -d .gpu-deps ] && export PYTHONPATH=$PWD/.gpu-deps${PYTHONPATH:+:$PYTHONPATH}
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
    python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
    python3 -c 'import liger_kernel.ops.fused_linear_cross_entropy as m; print("liger-kernel importable")' 2>&1 | tail -1
    nproc
} 2>&1 | tee "$out/gpu.txt"
work=$(mktemp -d)
python3 bench/trainer_throughput.py --steps "${STEPS:-50}" --limit-s 150 \
    --budget-s "${BENCH_BUDGET_S:-360}" --nanogpt "${NANOGPT_DIR:-.nanogpt}" \
    --json "$out/throughput.json" --work "$work/bench" ${ONLY:+--only "$ONLY"} 2>&1 |
    tee "$out/throughput.txt"
python3 bench/trainer_check.py --json "$out/throughput.json" --budget-s "${CHECK_BUDGET_S:-200}" \
    --work "$work/check" 2>&1 | tee "$out/check.txt"
find "$work" -name '*.log' -exec cp {} "$out/logs/" \;
rm -rf "$work"
