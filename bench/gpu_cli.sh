#!/usr/bin/env bash
# The CLI on a lent GPU machine as a user runs it (`--local`: the machine is the node), issue 40:
# verify, healthcheck, a gpt2-124m run with `top --once` during it, its telemetry and report.
# Every nvidia-smi call (argv, exit status, stdout, stderr) is recorded for the fake's fixtures.
# Run from the repository root with the controller's packages importable (python3 -m scripts.cli);
# everything lands in ${OUT:-gpu-out}/cli.tgz (checkpoints left out). About 2-3 minutes.
set -u
out=${OUT:-gpu-out}
mkdir -p "$out"
work=$(mktemp -d)
calls="$work/nvidia-smi-calls"
mkdir -p "$calls" "$work/bin"
real=$(command -v nvidia-smi) || { echo "gpu_cli: no nvidia-smi on PATH" >&2; exit 1; }
# One file per call (the telemetry sampler and verify may call at the same time).
cat >"$work/bin/nvidia-smi" <<EOF
#!/bin/sh
f=\$(mktemp "$calls/\$(date +%s%N)-XXXX")
"$real" "\$@" >"\$f.out" 2>"\$f.err"; rc=\$?
{ printf '=== nvidia-smi %s\n--- exit %s\n' "\$*" "\$rc"; cat "\$f.out"; printf -- '--- stderr\n'; cat "\$f.err"; } >"\$f"
cat "\$f.out"; cat "\$f.err" >&2; rm -f "\$f.out" "\$f.err"; exit \$rc
EOF
chmod +x "$work/bin/nvidia-smi"
export PATH="$work/bin:$PATH" GPUTRAIN_RUNS_DIR="$work/runs" PYTHONUNBUFFERED=1
gt() { python3 -m scripts.cli "$@"; }
fields=$(python3 -c 'from scripts.verify.nodes import GPU_FIELDS as a; from gputrain_node.telemetry import QUERY_FIELDS as b; print(",".join(dict.fromkeys(a + b)))')
step() { # name, command...: its output and seconds into $work/<name>.txt
    local name=$1; shift
    local t0=$SECONDS
    "$@" >"$work/$name.txt" 2>&1
    local rc=$?
    echo "--- exit $rc after $((SECONDS - t0)) s" >>"$work/$name.txt"
    echo "gpu_cli: $name exit $rc ($((SECONDS - t0)) s)"
}
step smi sh -c "nvidia-smi; nvidia-smi --version; nvidia-smi --query-gpu=$fields --format=csv; nvidia-smi -q"
step verify gt verify --local
step healthcheck timeout -s INT 120 python3 -m scripts.cli healthcheck --local
# shellcheck disable=SC2086 # RUN_ARGS: the trainer's flags, word-split on purpose
timeout -s INT "${RUN_TIMEOUT_S:-300}" python3 -m scripts.cli run --local --yes -- -m trainer.train ${RUN_ARGS:---preset gpt2-124m --steps 300} \
    --checkpoint-every 1000000 >"$work/run.txt" 2>&1 &
run=$!
for _ in $(seq 150); do grep -q 'step .*[0-9]/' "$work/run.txt" && break; sleep 1; done
sleep 8
step top gt top --local --once
wait "$run"
echo "--- exit $?" >>"$work/run.txt"
echo "gpu_cli: run done"
step report gt report --local
step kernel-log sh -c 'dmesg | grep -iE "nvrm|xid" | tail -20; dmesg | wc -l; sudo -n true; echo sudo $?'
step pip sh -c 'python3 -c "import torch, sys; print(sys.version, torch.__version__, torch.version.cuda)"'
tar czf "$out/cli.tgz" -C "$work" --exclude='*.pt' --exclude=tensorboard .
rm -rf "$work"
