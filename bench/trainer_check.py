"""The fastest settings, checked on the GPU: they learn like the defaults, resume exactly, and the
run's own summary reports what the throughput bench measured.

Reads `trainer_throughput.py --json`, takes its fastest configuration of ours (or `--config`), and
runs `python -m trainer.train` on the bench's preset:
1. the preset's own split (16 x 4 at gpt2-124m: the defaults before the bench) twice and the
   fastest settings once, `--steps` (200) steps each: the loss every 10 steps side by side. Same
   data, same initialisation, so only rounding differs; but GPU kernels are not bitwise
   reproducible, and in the steep part of the curve two runs of the same settings drift apart.
   The fastest agrees when its largest difference from the first run is within the two same-
   settings runs' own largest difference plus NOISE nats.
2. the fastest settings' 200-step summary (tokens/s, MFU) against the bench's row: within 3 %.
3. exact resume: 60 steps with a checkpoint at 30, then a fresh out dir resumed from that
   checkpoint: the losses of steps 31-60 against the uninterrupted run's, per step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer_throughput import ROOT, bench_preset, run_logged, trainer_env, warmup_steps

from trainer.config import PRESETS

NOISE = 0.05  # nats beyond the same settings' own run-to-run drift
AGREEMENT = 0.03  # the summary's figures against the bench's
RESUME_STEPS, RESUME_AT = 60, 30
PRESET = bench_preset(torch.cuda.is_available())


DEADLINE = [float("inf")]  # time.monotonic() by which every run has ended (--budget-s)


def train(
    flags: list[str], out: Path, steps: int, *extra: str
) -> tuple[str, dict[str, Any], dict[int, float]]:
    """One trainer run within the budget: (status, summary, loss per logged step)."""
    left = DEADLINE[0] - time.monotonic()
    if left < 20:
        return "skipped (--budget-s spent)", {}, {}
    argv = [sys.executable, "-m", "trainer.train", "--preset", PRESET, "--steps", str(steps)]
    argv += ["--eval-batches", "0", "--out", str(out), *flags, *extra]
    status, _ = run_logged(argv, ROOT, trainer_env(), min(300, left), out.with_suffix(".log"))
    if status != "ok":
        return status, {}, {}
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln]
    return status, summary, {r["step"]: r["loss"] for r in rows if "loss" in r}


def pick(rows: list[dict[str, Any]], name: str | None) -> dict[str, Any]:
    """The named row, else the fastest configuration of ours that ran."""
    ours = [r for r in rows if r["status"] == "ok" and not r["name"].startswith("nanoGPT")]
    if name is not None:
        ours = [r for r in ours if r["name"] == name]
    if not ours:
        sys.exit(f"trainer_check: no configuration of ours {name or ''} ran in the bench's JSON")
    return max(ours, key=lambda r: r["summary"]["tokens_per_s"])


def preset_split(preset: str) -> list[str]:
    p = PRESETS[preset]
    return ["--batch-size", str(p["batch_size"]), "--grad-accum", str(p["grad_accum"])]


def largest_gap(a: dict[int, float], b: dict[int, float], after: int) -> float:
    return max(abs(a[s] - b[s]) for s in a if s in b and s > after)


def curves(flags: list[str], steps: int, work: Path) -> bool:
    every = ["--log-every", "10", "--checkpoint-every", str(steps)]
    split = preset_split(PRESET)
    runs = {}
    for name, extra in (("split", split), ("split again", split), ("fastest", flags)):
        status, summary, losses = train([*extra, *every], work / name.replace(" ", "_"), steps)
        if status != "ok":
            print(f"  curves: {name} {status}")
            return False
        runs[name] = losses
    (work / "fastest_summary.json").write_text(json.dumps(summary))
    first, again, fast = runs["split"], runs["split again"], runs["fastest"]
    print(f"  step   {' '.join(split):<22} again     fastest   fastest - split")
    for step in sorted(first):
        if step in again and step in fast:
            print(
                f"  {step:<6} {first[step]:<22.4f} {again[step]:<9.4f} {fast[step]:<9.4f} "
                f"{fast[step] - first[step]:+.4f}"
            )
    warm = warmup_steps(steps)
    spread, worst = largest_gap(again, first, warm), largest_gap(fast, first, warm)
    ok = worst <= spread + NOISE
    print(
        f"  curves: after step {warm}, the fastest is at most {worst:.4f} nats from the split's "
        f"run; the split's two runs {spread:.4f} apart ({'PASS' if ok else 'FAIL'}: within "
        f"that + {NOISE})"
    )
    return ok


def agreement(bench_row: dict[str, Any], work: Path) -> bool:
    path = work / "fastest_summary.json"
    if not path.is_file():
        return False
    run, bench = json.loads(path.read_text()), bench_row["summary"]
    ok = True
    for key in ("tokens_per_s", "mfu"):
        if run.get(key) is None or bench.get(key) is None:
            print(f"  agreement: {key} not measured (CPU or an unknown GPU)")
            continue
        gap = run[key] / bench[key] - 1
        ok &= abs(gap) <= AGREEMENT
        shown = (lambda v: f"{v:,.0f}") if key == "tokens_per_s" else (lambda v: f"{100 * v:.1f} %")
        print(
            f"  agreement: {key} run summary {shown(run[key])} vs bench {shown(bench[key])}: "
            f"{100 * gap:+.1f} % ({'PASS' if abs(gap) <= AGREEMENT else 'FAIL'}, bound 3 %)"
        )
    return ok


def resume(flags: list[str], work: Path) -> bool:
    every = ["--log-every", "1", "--checkpoint-every", str(RESUME_AT), "--keep-checkpoints", "2"]
    status, _, whole = train([*flags, *every], work / "whole", RESUME_STEPS)
    ckpt = work / "whole" / f"ckpt-{RESUME_AT:08d}.pt"
    if status != "ok" or not ckpt.is_file():
        print(f"  resume: the uninterrupted run {status}")
        return False
    status, summary, resumed = train(
        [*flags, *every], work / "resumed", RESUME_STEPS, "--resume", str(ckpt)
    )
    if status != "ok":
        print(f"  resume: the resumed run {status}")
        return False
    later = [s for s in whole if s > RESUME_AT]
    same = sum(resumed.get(s) == whole[s] for s in later)
    worst = max(abs(resumed[s] - whole[s]) for s in later if s in resumed)
    ok = summary.get("resumed_from") == RESUME_AT and len(later) == RESUME_STEPS - RESUME_AT
    ok &= worst < NOISE
    print(
        f"  resume from step {RESUME_AT}: {same} of {len(later)} losses equal bit for bit, "
        f"largest difference {worst:.2e} nats ({'PASS' if ok else 'FAIL'})"
    )
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--json", type=Path, required=True, help="trainer_throughput.py --json's file")
    p.add_argument("--config", help="the bench row to check (default: the fastest of ours)")
    p.add_argument("--steps", type=int, default=200, help="steps of the two curves (default 200)")
    p.add_argument("--budget-s", type=float, help="end every run by then (default: no bound)")
    p.add_argument(
        "--work", type=Path, help="keep the runs' folders and logs here (default: a temp dir)"
    )
    args = p.parse_args()
    if args.budget_s:
        DEADLINE[0] = time.monotonic() + args.budget_s
    rows = json.loads(args.json.read_text())
    row = pick(rows, args.config)
    flags = row["flags"]
    print(
        f"trainer_check: {row['name']!r} ({' '.join(flags) or 'no flags'}), "
        f"{row['summary']['tokens_per_s']:,.0f} tokens/s in the bench"
    )
    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="check-")))
        work.mkdir(parents=True, exist_ok=True)
        results = [curves(flags, args.steps, work), agreement(row, work), resume(flags, work)]
    print(f"trainer_check: {'PASS' if all(results) else 'FAIL'}")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
