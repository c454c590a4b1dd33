#!/usr/bin/env bash
# What a lent GPU runs in one go (`device` tool): the CLI as a user runs it (bench/gpu_cli.sh),
# the throughput table with nanoGPT side by side at each of its splits, then the fastest settings'
# checks (curves, summary vs bench, exact resume). Each part can be left out: CLI=0, BENCH=0,
# CHECK=0; ONLY and NANOGPT_SPLITS pass to the bench, budgets in BENCH_BUDGET_S, CHECK_BUDGET_S.
# Needs nanoGPT's train.py, model.py, configurator.py in $NANOGPT_DIR (default .nanogpt); wheels in
# .whl (the controller's pydantic, zstandard..., liger-kernel, torchao) are installed to /tmp/site.
# Lands in ${OUT:-gpu-out}: gpu.txt, cli.tgz, throughput.txt/.json, check.txt, logs.tgz.
set -u
mkdir -p "${OUT:-gpu-out}"
out=$(cd "${OUT:-gpu-out}" && pwd)
wheels=${WHEELS:-.whl}
if compgen -G "$wheels/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$wheels"/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
    python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
    python3 -c 'import torchao; print("torchao", torchao.__version__)' 2>&1 | tail -1
    python3 -c 'import liger_kernel.ops.fused_linear_cross_entropy as m; print("liger-kernel importable")' 2>&1 | tail -1
    nproc
} 2>&1 | tee "$out/gpu.txt"
[ "${CLI:-1}" = 1 ] && OUT=$out bash bench/gpu_cli.sh
work=$(mktemp -d)
if [ "${BENCH:-1}" = 1 ]; then
    python3 bench/trainer_throughput.py --steps "${STEPS:-50}" --limit-s "${LIMIT_S:-150}" \
        --budget-s "${BENCH_BUDGET_S:-360}" --nanogpt "${NANOGPT_DIR:-.nanogpt}" \
        ${NANOGPT_SPLITS:+--nanogpt-splits "$NANOGPT_SPLITS"} \
        --json "$out/throughput.json" --work "$work/bench" ${ONLY:+--only "$ONLY"} 2>&1 |
        tee "$out/throughput.txt"
fi
if [ "${CHECK:-1}" = 1 ]; then
    python3 bench/trainer_check.py --json "$out/throughput.json" \
        --budget-s "${CHECK_BUDGET_S:-200}" --work "$work/check" 2>&1 | tee "$out/check.txt"
fi
(cd "$work" && find . -name '*.log' -print0 | tar czf "$out/logs.tgz" --null -T -)
rm -rf "$work"
