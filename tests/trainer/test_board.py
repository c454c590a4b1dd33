"""The reference trainer's TensorBoard event files, read back with tensorboard's own event reader:
in the out dir by default, in GPUTRAIN_TENSORBOARD_DIR, or copied to a bucket (the emulator)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.support.gcs_emulator import GcsEmulator
from tests.support.trainer_helpers import metrics, summary
from trainer.train import main

FLAGS = ["--preset", "tiny", "--steps", "40", "--log-every", "10", "--checkpoint-every", "20"]


def _scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_event_files_hold_the_logged_losses_and_eval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPUTRAIN_TENSORBOARD_DIR", raising=False)
    out = tmp_path / "out"
    main([*FLAGS, "--out", str(out)])
    scalars = _scalars(out / "tensorboard")
    logged = [(r["step"], r["loss"]) for r in metrics(out)]
    assert [s for s, _ in scalars["train/loss"]] == [s for s, _ in logged] == [1, 10, 20, 30, 40]
    assert [v for _, v in scalars["train/loss"]] == pytest.approx([v for _, v in logged])
    assert {"train/lr", "train/tokens_per_s", "eval/loss"} <= set(scalars)
    assert scalars["eval/loss"] == [(40, pytest.approx(summary(out)["eval_loss"]))]
    assert "train/mfu" not in scalars  # null on CPU: not written as a number


def test_a_gs_tensorboard_dir_gets_the_event_files(
    gcs: GcsEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"gs://{gcs.bucket_name}/runs/r9/tensorboard"
    monkeypatch.setenv("GPUTRAIN_TENSORBOARD_DIR", uri)
    out = tmp_path / "out"
    main([*FLAGS, "--out", str(out)])
    names = gcs.names("runs/r9/tensorboard/")
    assert len(names) == 1 and names[0].split("/")[-1].startswith("events.out.tfevents.")
    copy = tmp_path / "copy"
    copy.mkdir()
    gcs.client().bucket(gcs.bucket_name).blob(names[0]).download_to_filename(
        str(copy / names[0].split("/")[-1])
    )
    assert [s for s, _ in _scalars(copy)["train/loss"]] == [1, 10, 20, 30, 40]
