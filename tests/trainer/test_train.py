"""The reference trainer on CPU: learning, DDP agreement, exact resume, data sources, outputs."""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.support.gcs_emulator import GcsEmulator
from tests.support.trainer_helpers import (
    NODE_SET,
    child_env,
    free_port,
    metrics,
    node_argv,
    run,
    start,
    summary,
    torchrun_argv,
    wait_for_steps,
)
from trainer import checkpoint
from trainer.config import parse_config
from trainer.data import EVAL, LLMC_HEADER_BYTES, LLMC_MAGIC, MarkovChain, open_data, read_bin
from trainer.errors import InputError
from trainer.mfu import flops_per_token, mfu, peak_tflops
from trainer.model import GPT, GPTConfig, padded_vocab
from trainer.step import lr_at
from trainer.storage import CheckpointStore, GsUri
from trainer.train import main

METRIC_FIELDS = {"step", "loss", "lr", "tokens_per_s", "mfu", "peak_mem_bytes", "elapsed_s"}
SUMMARY_FIELDS = {
    "final_loss",
    "loss_floor",
    "initial_loss",
    "tokens_per_s",
    "mfu",
    "devices",
    "world_size",
    "steps",
    "elapsed_s",
    "resumed_from",
}
TINY_STEPS = 300
pytestmark = pytest.mark.filterwarnings("ignore:Unable to enable fault handler")


def assert_learned_toward_floor(s: dict[str, Any]) -> None:
    """From ≈ ln 64 to within 0.15 nats of the chain's exact floor ln 4."""
    assert s["loss_floor"] == pytest.approx(math.log(4))
    assert abs(s["initial_loss"] - math.log(64)) < 0.3
    assert s["final_loss"] < s["initial_loss"] - 2.3
    assert s["loss_floor"] - 0.02 < s["eval_loss"] < s["loss_floor"] + 0.15


@pytest.fixture(scope="module")
def torchrun_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny preset's default run under torchrun with 2 gloo ranks, every step logged: run once
    per session, also under pytest-xdist (the first worker to ask runs it, the others wait)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # this session's folder, above each worker's own
    out, ran = shared / "torchrun-2-ranks", shared / "torchrun-2-ranks.ok"
    with (shared / "torchrun-2-ranks.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not ran.exists():
            shutil.rmtree(out, ignore_errors=True)  # a failed try's leftovers
            done = run(torchrun_argv("trainer.train", ["--log-every", "1"]), out)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            ran.touch()
    return out


def test_single_process_default_run_learns_and_writes_documented_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m trainer.train --preset tiny`: its main() in this process (a process of its own:
    test_bad_data_in_a_real_process_has_no_traceback; under torchrun: the tests below)."""
    for name in NODE_SET:  # as child_env() leaves them for a process
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPUTRAIN_OUT", str(tmp_path))
    started = time.monotonic()
    main(["--preset", "tiny"])  # returns: exit status 0 (any other is a SystemExit)
    wall = time.monotonic() - started
    stdout = capsys.readouterr().out
    s = summary(tmp_path)  # written to $GPUTRAIN_OUT: --out defaults to it
    assert s.keys() >= SUMMARY_FIELDS
    assert_learned_toward_floor(s)
    assert (s["world_size"], s["steps"], s["resumed_from"], s["mfu"]) == (1, TINY_STEPS, None, None)
    assert s["devices"][0].startswith("cpu") and s["tokens_per_s"] > 0
    rows = metrics(tmp_path)
    assert all(r.keys() >= METRIC_FIELDS and r["mfu"] is None for r in rows)
    assert [r["step"] for r in rows] == [1, *range(25, TINY_STEPS + 1, 25)]
    assert rows[-1]["loss"] == s["final_loss"] and rows[0]["loss"] == s["initial_loss"]
    assert [p.name for _, p in checkpoint.list_checkpoints(tmp_path)] == [
        "ckpt-00000200.pt",
        "ckpt-00000300.pt",
    ]
    assert "step    300/300 | loss" in stdout  # one readable line per interval
    assert "floor 1.3863)" in stdout  # the done: line rounds ln 4 like the losses
    assert wall < 60, f"the tiny preset took {wall:.0f} s"


def test_two_ranks_learn_and_end_with_identical_parameters(torchrun_run: Path) -> None:
    s = summary(torchrun_run)
    assert_learned_toward_floor(s)
    assert s["world_size"] == 2 and len(s["devices"]) == 2 and s["mfu"] is None
    assert len(s["param_checksums"]) == 2 and s["params_in_sync"] is True
    assert s["param_checksums"][0] == s["param_checksums"][1]
    assert [r["step"] for r in metrics(torchrun_run)] == list(range(1, TINY_STEPS + 1))


def test_sigterm_checkpoints_uploads_and_resume_reproduces_every_later_loss(
    torchrun_run: Path, tmp_path: Path, gcs: GcsEmulator
) -> None:
    """Resumed twice: on a new node from the bucket, and on the same node from its disk."""
    uri = f"gs://{gcs.bucket_name}/runs/sig/"
    local_only = torchrun_argv("trainer.train", ["--log-every", "1"])
    argv = [*local_only, "--checkpoint-uri", uri]
    out = tmp_path / "node"
    proc = start(argv, child_env(out))
    wait_for_steps(out, 200, [proc])  # late: each resume trains only the steps after it
    proc.send_signal(signal.SIGTERM)  # a spot preemption notice: torchrun forwards it
    log, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0, log[-3000:]
    stopped = [int(c.split()[0]) for c in log.split("SIGTERM: stopped at step ")[1:]]
    assert stopped and 200 <= stopped[0] < TINY_STEPS, log[-3000:]
    assert "with a checkpoint (saved and uploaded in" in log, log[-3000:]
    assert checkpoint.list_checkpoints(out)[-1][0] == stopped[0]
    complete, problems = CheckpointStore(GsUri(gcs.bucket_name, "runs/sig/")).complete()
    assert complete[-1].step == stopped[0] and problems == []  # in the bucket, manifest and all
    assert complete[-1].size == (out / f"ckpt-{stopped[0]:08d}.pt").stat().st_size

    new_node = tmp_path / "new-node"  # the preempted VM's disk is gone: only the bucket has it
    for resumed_out, how in ((new_node, argv), (out, local_only)):
        done = run(how, resumed_out)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert summary(resumed_out)["resumed_from"] == stopped[0]
        resumed = {r["step"]: r["loss"] for r in metrics(resumed_out)}
        reference = {r["step"]: r["loss"] for r in metrics(torchrun_run)}
        later = [s for s in reference if s > stopped[0]]
        assert [resumed[s] for s in later] == [reference[s] for s in later]  # bit for bit
        assert summary(resumed_out)["param_checksums"] == summary(torchrun_run)["param_checksums"]
        assert sorted(resumed) == list(
            range(1 if resumed_out == out else stopped[0] + 1, TINY_STEPS + 1)
        )


def test_a_node_without_checkpoints_receives_the_newest_by_broadcast(
    torchrun_run: Path, tmp_path: Path
) -> None:
    """Two torchrun agents as two nodes with separate out dirs (no shared filesystem): node 0 holds
    the checkpoints of a world of 2 ranks (the 2-rank run's: a checkpoint holds no rank layout),
    node 1 is a fresh replacement VM without any."""
    outs = [tmp_path / "node0", tmp_path / "node1"]
    outs[0].mkdir()
    kept = checkpoint.list_checkpoints(torchrun_run)
    assert [s for s, _ in kept] == [200, TINY_STEPS]
    for _, path in kept:
        shutil.copy(path, outs[0])
    port, args = free_port(), ["--steps", str(TINY_STEPS + 1), "--eval-batches", "0"]
    procs = [start(node_argv(port, "nodes", args), child_env(out)) for out in outs]
    for p in procs:
        log, _ = p.communicate(timeout=120)
        assert p.returncode == 0, log[-3000:]
    for out in outs:
        s = summary(out)
        assert s["resumed_from"] == TINY_STEPS and s["params_in_sync"] and s["world_size"] == 2


def write_text_corpus(directory: Path) -> int:
    directory.mkdir(parents=True)
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "the",
        "lazy",
        "dog",
        "while",
        "seven",
        "wizards",
        "quietly",
        "hum",
    ]
    rng = np.random.default_rng(0)
    total = 0
    for name in ("a.txt", "sub/b.md"):
        text = " ".join(rng.choice(words, size=3000)) + "\n"
        (directory / name).parent.mkdir(exist_ok=True)
        (directory / name).write_text(text)
        total += len(text.encode())
    return total


def test_text_directory_is_tokenized_once_into_a_byte_cache_and_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = tmp_path / "data" / "corpus"
    nbytes = write_text_corpus(corpus)
    monkeypatch.setenv("GPUTRAIN_DATA_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    main(
        [
            "--data",
            str(corpus),
            "--out",
            str(out),
            "--steps",
            "60",
            "--log-every",
            "20",
            "--eval-batches",
            "2",
        ]
    )
    (cache,) = (tmp_path / "cache").glob("corpus-*.bytes.u16")
    assert cache.stat().st_size == 2 * nbytes
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["corpus"]  # nothing beside it
    s = summary(out)
    assert s["loss_floor"] is None and s["data"] == str(corpus)
    assert abs(s["initial_loss"] - math.log(256)) < 0.5
    assert s["final_loss"] < s["initial_loss"] - 2.0
    mtime = cache.stat().st_mtime_ns
    open_data(str(corpus), block_size=32, vocab_size=64, successors=4, seed=0)
    assert cache.stat().st_mtime_ns == mtime  # reused, not rebuilt


def test_nanogpt_bin_file_trains_with_its_vocab(tmp_path: Path) -> None:
    tokens = (np.arange(20_000) * 7 % 1000).astype(np.uint16)  # a learnable cycle over 1000 ids
    path = tmp_path / "train.bin"
    tokens.tofile(path)
    main(
        [
            "--data",
            str(path),
            "--vocab-size",
            "1000",
            "--out",
            str(tmp_path / "out"),
            "--steps",
            "60",
            "--log-every",
            "20",
            "--eval-batches",
            "2",
        ]
    )
    s = summary(tmp_path / "out")
    assert abs(s["initial_loss"] - math.log(1000)) < 0.5 and s["final_loss"] < s["initial_loss"] - 2


def test_llmc_header_is_understood(tmp_path: Path) -> None:
    tokens = np.arange(100, dtype=np.uint16)
    header = np.zeros(LLMC_HEADER_BYTES // 4, dtype=np.int32)
    header[:3] = (LLMC_MAGIC, 1, len(tokens))
    path = tmp_path / "llmc.bin"
    path.write_bytes(header.tobytes() + tokens.tobytes())
    assert np.array_equal(read_bin(path), tokens)


def bad_bin(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda d: d / "missing.bin", "no such file"),
        (lambda d: bad_bin(d / "odd.bin", b"\x01\x00\x02"), "corrupt"),
        (lambda d: bad_bin(d / "short.bin", np.arange(10, dtype=np.uint16).tobytes()), "too short"),
        (lambda d: bad_bin(d / "empty.txt", b""), "too short"),
        (lambda d: bad_bin(d / "big.bin", np.full(100, 60000, dtype=np.uint16).tobytes()), "60000"),
        (
            lambda d: bad_bin(
                d / "hdr.bin",
                np.array([LLMC_MAGIC, 1, 999] + [0] * 253, dtype=np.int32).tobytes()
                + b"\x00\x00" * 10,
            ),
            "corrupt",
        ),
    ],
)
def test_bad_data_is_one_line_naming_the_file_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any, words: str
) -> None:
    path = make(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["--data", str(path), "--out", str(tmp_path / "out"), "--vocab-size", "1000"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and words in err
    assert not (tmp_path / "out").exists()  # nothing started


def test_bad_data_in_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    done = run([sys.executable, "-m", "trainer.train", "--data", str(tmp_path / "nope.txt")])
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: --data {tmp_path / 'nope.txt'}: no such file or directory (or use 'synthetic')"
    ]


def test_out_defaults_to_gputrain_out_then_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUTRAIN_OUT", "/results/node")
    assert parse_config([]).out == Path("/results/node")
    assert parse_config(["--out", "x"]).out == Path("x")
    monkeypatch.delenv("GPUTRAIN_OUT")
    assert parse_config([]).out == Path("out")


def test_resume_refuses_a_checkpoint_of_another_model(tmp_path: Path, capsys: Any) -> None:
    main(["--out", str(tmp_path), "--steps", "2", "--eval-batches", "0"])
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path), "--steps", "4", "--n-embd", "32"])
    assert exc.value.code == 2 and "is for model" in capsys.readouterr().err


def test_markov_chain_floor_is_exact_and_batches_are_pure_functions() -> None:
    chain = MarkovChain.from_seed(64, 4, seed=3)
    assert chain.entropy_rate() == pytest.approx(math.log(4), abs=1e-12)
    data = open_data("synthetic", block_size=32, vocab_size=64, successors=4, seed=3)
    b = data.batch(3, step=5, rank=1, rows=8, block=32)
    assert b.shape == (8, 33) and np.array_equal(b, data.batch(3, 5, 1, 8, 32))
    for other in (
        data.batch(3, 6, 1, 8, 32),
        data.batch(3, 5, 0, 8, 32),
        data.batch(4, 5, 1, 8, 32),
        data.batch(3, 5, 1, 8, 32, stream=EVAL),
    ):
        assert not np.array_equal(b, other)
    successors = chain.successors
    assert all(b[i, t + 1] in successors[b[i, t]] for i in range(8) for t in range(32))
    # empirical conditional entropy of a long sample matches the exact rate
    long = chain.sample(np.random.default_rng(0), 1, 200_000)[0]
    pairs = np.bincount(long[:-1] * 64 + long[1:], minlength=64 * 64).reshape(64, 64)
    p = pairs / pairs.sum(axis=1, keepdims=True).clip(min=1)
    h = -(pairs / pairs.sum() * np.log(np.where(p > 0, p, 1))).sum()
    assert h == pytest.approx(math.log(4), abs=0.01)


def test_gpt2_124m_parameter_count_and_flops_match_the_published_figures() -> None:
    cfg = GPTConfig(
        n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=padded_vocab(50257)
    )
    assert cfg.vocab_size == 50304
    with torch.device("meta"):
        model = GPT(cfg)
    assert model.num_params(non_embedding=False) == 124_373_760
    assert model.num_params() == 123_587_328
    assert flops_per_token(cfg, model.num_params()) / 1e9 == pytest.approx(0.855, abs=0.001)


def test_peak_table_and_mfu() -> None:
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989
    assert peak_tflops("NVIDIA H100 PCIe") == 756
    assert peak_tflops("NVIDIA H100 NVL") == 835
    assert peak_tflops("NVIDIA H200") == 989
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312
    assert peak_tflops("NVIDIA L4") == 121
    assert peak_tflops("Tesla T4") == 65 and peak_tflops("Tesla V100-SXM2-16GB") == 125
    assert peak_tflops("NVIDIA GeForce RTX 4090") is None  # unknown: omitted, not guessed
    assert mfu(578_500, 0.855e9, 989, 1) == pytest.approx(0.5, abs=0.001)
    assert mfu(1000.0, 1e9, None, 1) is None


def test_lr_warms_up_then_decays_to_its_floor() -> None:
    cfg = parse_config(["--steps", "100", "--warmup-steps", "10", "--lr", "1.0"])
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0) and lr_at(100, cfg) == pytest.approx(0.1)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 100))


def test_checkpoints_keep_the_last_k_and_ignore_temp_files(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        checkpoint.save(tmp_path, {"step": step, "model": {}, "optimizer": {}}, keep=2)
    (tmp_path / "ckpt-00000040.pt.tmp123").write_bytes(b"half written")
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [20, 30]
    (tmp_path / "ckpt-00000050.pt").write_bytes(b"garbage")
    with pytest.raises(InputError, match=r"ckpt-00000050\.pt cannot be read"):
        checkpoint.load(tmp_path / "ckpt-00000050.pt")


def test_metrics_lines_past_the_resume_point_are_dropped(tmp_path: Path) -> None:
    from trainer.metrics import Metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 10, 20, 30)))
    Metrics(path, writes=True, keep_upto=20)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 10, 20]
