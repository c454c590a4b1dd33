"""The Vertex AI entry point: CLUSTER_SPEC (and Vertex's env) -> torchrun argv, errors in one line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gputrain_node import vertex_entry
from gputrain_node.vertex_entry import (
    TRAINER,
    Placement,
    nproc_here,
    output_files,
    parse_cluster_spec,
    placement_from_env,
    split_entry,
    torchrun_argv,
)
from gputrain_node.vertex_mirror import InputError
from tests.support.gcs_emulator import GcsEmulator
from tests.support.trainer_helpers import ROOT, child_env, free_port
from trainer.storage import MANIFEST_SUFFIX


def spec(task: str, index: object, workers: int = 0, **extra: Any) -> str:
    cluster = {"workerpool0": ["cmle-training-workerpool0-ab12-0:2222"]}
    if workers:
        cluster["workerpool1"] = [
            f"cmle-training-workerpool1-ab12-{i}:2222" for i in range(workers)
        ]
    return json.dumps(
        {
            "cluster": cluster,
            "environment": "cloud",
            "task": {"type": task, "index": index, "trial": ""},
            "job": '{"python_module":"gputrain_node.vertex_entry"}',
            **extra,
        }
    )


CHIEF = "cmle-training-workerpool0-ab12-0"


def test_one_replica_runs_standalone_with_one_process_per_gpu(tmp_path: Path) -> None:
    placement = parse_cluster_spec(spec("workerpool0", 0))
    assert placement == Placement(1, 0, CHIEF, 2222, "workerpool0[0]")
    devices = str(tmp_path / "nvidia[0-9]*")
    assert nproc_here(False, devices) == 1  # no NVIDIA device: one process
    for name in ("nvidiactl", "nvidia0", "nvidia1"):
        (tmp_path / name).touch()
    assert nproc_here(True, devices) == 1  # the trainer's --device cpu
    nproc = nproc_here(False, devices)  # torchrun counts the GPUs (it imports torch anyway)
    argv = torchrun_argv(placement, nproc, ["--preset", "gpt2-124m"])
    assert argv == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=gpu",
        "--standalone",
        "--nnodes=1",
        "-m",
        "trainer.train",
        "--preset",
        "gpt2-124m",
    ]


@pytest.mark.parametrize(
    ("task", "index", "rank"), [("workerpool0", 0, 0), ("workerpool1", 0, 1), ("workerpool1", 2, 3)]
)
def test_chief_and_three_workers_get_ranks_in_pool_order(task: str, index: int, rank: int) -> None:
    placement = parse_cluster_spec(spec(task, index, workers=3))
    assert placement == Placement(4, rank, CHIEF, 2222, f"{task}[{index}]")
    argv = torchrun_argv(placement, 1, ["--device", "cpu"])
    assert argv[3:] == [
        "--nproc-per-node=1",
        "--nnodes=4",
        f"--node-rank={rank}",
        f"--master-addr={CHIEF}",
        "--master-port=2222",
        "-m",
        "trainer.train",
        "--device",
        "cpu",
    ]


def test_an_evaluator_runs_its_entry_on_its_own_outside_the_trainers_world() -> None:
    """A job file's pool 3 (evaluators, CPU or GPU): the entry refused it ("does not run the
    trainer") once Vertex started it. It runs standalone, named evaluator-N (its mirror, its
    log lines), and Vertex's rendezvous variables, which are the trainers', do not move it."""
    cluster = json.loads(spec("workerpool0", 0, workers=2))["cluster"]
    cluster["workerpool3"] = ["cmle-training-workerpool3-ab12-0:2222"] * 2
    text = json.dumps({"cluster": cluster, "task": {"type": "workerpool3", "index": 1}})
    placement = placement_from_env(
        {"CLUSTER_SPEC": text, "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "23456"}
    )
    assert placement == Placement(1, 0, "127.0.0.1", 0, "workerpool3[1]", evaluator=1)
    assert placement.replica == "evaluator-1"
    assert [Placement(3, r, "c", 1).replica for r in (0, 2)] == ["chief", "worker-2"]
    assert torchrun_argv(placement, 1, [], ("-m", "jobs.evaluate"))[3:] == [
        "--nproc-per-node=1", "--standalone", "--nnodes=1", "-m", "jobs.evaluate",
    ]  # fmt: skip
    outside = text.replace('"index": 1', '"index": 2')
    with pytest.raises(InputError, match="task index 2 is outside workerpool3's 2 replicas"):
        parse_cluster_spec(outside)


def test_the_reference_trainer_as_an_evaluator_is_one_line_before_torchrun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It would train a model of its own, into the chief's AIP_CHECKPOINT_DIR."""
    cluster = {"workerpool0": ["c:1"], "workerpool3": ["e:1"]}
    text = json.dumps({"cluster": cluster, "task": {"type": "workerpool3", "index": 0}})
    monkeypatch.setenv("CLUSTER_SPEC", text)
    monkeypatch.setenv("GPUTRAIN_OUT", str(tmp_path / "out"))
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(vertex_entry.subprocess, "Popen", None)
    with pytest.raises(SystemExit) as e:
        vertex_entry.main(["--preset", "tiny"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: ENTRY on workerpool3[0]: the reference trainer trains; an evaluator runs your "
        "own -m MODULE or script.py"
    ]


def test_master_addr_and_port_override_the_spec_and_rank_world_size_stand_in_for_it() -> None:
    env = {
        "CLUSTER_SPEC": spec("workerpool1", 1, workers=2),
        "MASTER_ADDR": "10.0.0.2",
        "MASTER_PORT": "23456",
    }
    assert placement_from_env(env) == Placement(3, 2, "10.0.0.2", 23456, "workerpool1[1]")
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "23456"}
    assert placement_from_env(env) == Placement(2, 1, "10.0.0.2", 23456, "rank 1")
    assert placement_from_env({}).nnodes == 1


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"CLUSTER_SPEC": "{not json"}, "CLUSTER_SPEC: not JSON"),
        ({"CLUSTER_SPEC": "[1, 2]"}, "CLUSTER_SPEC: expected an object with 'cluster' and 'task'"),
        (
            {
                "CLUSTER_SPEC": json.dumps(
                    {"cluster": {}, "task": {"type": "workerpool0", "index": 0}}
                )
            },
            "workerpool0 has 0 replicas, expected exactly 1",
        ),
        (
            {"CLUSTER_SPEC": spec("workerpool2", 0, workers=1)},
            "task type 'workerpool2' does not run the trainer",
        ),
        (
            {"CLUSTER_SPEC": spec("workerpool1", 3, workers=3)},
            "task index 3 is outside workerpool1's 3 replicas",
        ),
        ({"CLUSTER_SPEC": spec("workerpool0", "0")}, "task index '0' is outside"),
        (
            {
                "CLUSTER_SPEC": json.dumps(
                    {
                        "cluster": {"workerpool0": ["chief"]},
                        "task": {"type": "workerpool0", "index": 0},
                    }
                )
            },
            "workerpool0[0] is 'chief', expected 'host:port'",
        ),
        (
            {
                "CLUSTER_SPEC": json.dumps(
                    {
                        "cluster": {"workerpool0": ["c:1"], "workerpool1": "w:2"},
                        "task": {"type": "workerpool0", "index": 0},
                    }
                )
            },
            "each cluster pool must be a list",
        ),
        (
            {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
            "RANK 2: must be below WORLD_SIZE 2",
        ),
        ({"RANK": "1", "WORLD_SIZE": "2"}, "MASTER_ADDR/MASTER_PORT: needed"),
        (
            {"CLUSTER_SPEC": spec("workerpool0", 0), "MASTER_PORT": "http"},
            "MASTER_PORT http: must be a whole number",
        ),
    ],
)
def test_malformed_environments_are_one_clear_line(env: dict[str, str], words: str) -> None:
    with pytest.raises(InputError) as e:
        placement_from_env(env)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_two_replicas_train_with_gloo_and_the_chief_puts_outputs_in_the_bucket(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    """Two local processes, each with its own Vertex-style CLUSTER_SPEC, as Vertex starts them."""
    base = f"gs://{gcs.bucket_name}/runs/v1"
    port, procs = free_port(), []
    cluster = {"workerpool0": [f"127.0.0.1:{port}"], "workerpool1": ["127.0.0.1:2222"]}
    for kind in ("workerpool0", "workerpool1"):
        cwd = tmp_path / kind  # each replica has its own disk; --out defaults to ./out there
        cwd.mkdir()
        env = child_env()
        env.update(
            CLUSTER_SPEC=json.dumps({"cluster": cluster, "task": {"type": kind, "index": 0}}),
            AIP_MODEL_DIR=f"{base}/model/",
            AIP_CHECKPOINT_DIR=f"{base}/checkpoints/",
        )
        argv = [
            sys.executable,
            "-m",
            "gputrain_node.vertex_entry",
            "--device",
            "cpu",
            "--steps",
            "60",
        ]
        argv += ["--checkpoint-every", "30", "--log-every", "10", "--eval-batches", "2"]
        procs.append(
            subprocess.Popen(
                argv, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
        )
    logs = [p.communicate(timeout=150)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert "vertex: workerpool0[0] is node 0 of 2, 1 process(es)" in logs[0]
    assert "vertex: workerpool1[0] is node 1 of 2" in logs[1]
    assert f"vertex: copied summary.json, metrics.jsonl to {base}/model/" in logs[0]
    assert "vertex: copied" not in logs[1]  # only the chief uploads

    assert gcs.names("runs/v1/model/") == [
        "runs/v1/model/metrics.jsonl",
        "runs/v1/model/summary.json",
    ]
    s = json.loads(gcs.read("runs/v1/model/summary.json"))
    assert s["world_size"] == 2 and s["params_in_sync"] and s["steps"] == 60
    assert s["final_loss"] < s["initial_loss"] - 1.5  # it learned
    rows = [json.loads(line) for line in gcs.read("runs/v1/model/metrics.jsonl").splitlines()]
    assert [r["step"] for r in rows] == [1, 10, 20, 30, 40, 50, 60]
    assert gcs.names("runs/v1/checkpoints/") == [
        f"runs/v1/checkpoints/ckpt-000000{s}.pt{m}" for s in (30, 60) for m in ("", MANIFEST_SUFFIX)
    ]
    for kind in ("workerpool0", "workerpool1"):  # every node also kept its local copy
        assert (tmp_path / kind / "out" / "ckpt-00000060.pt").is_file()


def test_bad_trainer_flags_fail_before_torchrun_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The entry's main() in this process (a replica's process adds nothing asserted here):
    exit 2, one line, and no process started."""
    monkeypatch.setenv("CLUSTER_SPEC", spec("workerpool0", 0))
    monkeypatch.setenv("GPUTRAIN_OUT", str(tmp_path / "out"))  # main() sets it: restored after
    for name in ("AIP_CHECKPOINT_DIR", "AIP_MODEL_DIR", "GPUTRAIN_CHECKPOINT_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(ROOT)

    def no_process(*argv: object, **kw: object) -> None:
        raise AssertionError(f"a process started: {argv}")

    monkeypatch.setattr(vertex_entry.subprocess, "Popen", no_process)
    with pytest.raises(SystemExit) as e:
        vertex_entry.main(["--steps", "0"])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == ["error: --steps 0: must be a whole number >= 1"]
    assert out == ""  # not even the entry's placement line: torchrun never came near


# ---- entries other than the reference trainer ---------------------------------------------------


def test_entry_is_trainer_flags_a_module_or_a_script_of_the_code(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "fit.py").write_text("print(1)\n")
    assert split_entry([], tmp_path) == (TRAINER, [])
    assert split_entry(["--preset", "tiny"], tmp_path) == (TRAINER, ["--preset", "tiny"])
    assert split_entry(["-m", "trainer.train", "--steps", "5"], tmp_path) == (
        TRAINER,
        ["--steps", "5"],
    )
    assert split_entry(["-m", "my.pkg", "a b", "$x"], tmp_path) == (("-m", "my.pkg"), ["a b", "$x"])
    assert split_entry(["jobs/fit.py", "--lr", "3"], tmp_path) == (
        (str(tmp_path / "jobs" / "fit.py"),),
        ["--lr", "3"],
    )
    placement = Placement(2, 1, "chief", 2222)
    argv = torchrun_argv(placement, 4, ["--lr", "3"], (str(tmp_path / "jobs" / "fit.py"),))
    assert argv[-3:] == [str(tmp_path / "jobs" / "fit.py"), "--lr", "3"]


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        (["-m"], "entry: -m needs a module name"),
        (["-m", "--steps"], "entry: -m needs a module name"),
        (["missing.py"], "entry script missing.py: not in the job's code"),
    ],
)
def test_bad_entries_are_one_line(entry: list[str], words: str, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=words) as e:
        split_entry(entry, tmp_path)
    assert "\n" not in str(e.value)


def test_outputs_are_summary_and_metrics_first_then_the_rest_but_checkpoints(
    tmp_path: Path,
) -> None:
    for name in ("metrics.jsonl", "health.json", "ckpt-00000010.pt", "a.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "sub").mkdir()
    assert output_files(tmp_path) == [
        tmp_path / "summary.json",  # missing files are skipped by the upload
        tmp_path / "metrics.jsonl",
        tmp_path / "a.txt",
        tmp_path / "health.json",
    ]


def test_a_script_entry_runs_in_the_code_dir_and_its_outputs_reach_the_bucket(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    """As Vertex runs a package: gputrain_code.ROOT is the working directory, the script is one of
    its files, relative paths resolve there and the chief copies the out dir to AIP_MODEL_DIR."""
    site = tmp_path / "site"
    root = site / "gputrain_code" / "files"
    (root / "jobs").mkdir(parents=True)
    (site / "gputrain_code" / "__init__.py").write_text(
        "from pathlib import Path\nROOT = Path(__file__).resolve().parent / 'files'\n"
    )
    (root / "data.txt").write_text("41\n")
    (root / "jobs" / "count.py").write_text(
        "import os, sys\nfrom pathlib import Path\n"
        "n = int(Path('data.txt').read_text()) + 1\n"  # relative: the code dir
        "out = Path(os.environ['GPUTRAIN_OUT']); out.mkdir(parents=True, exist_ok=True)\n"
        "(out / 'answer.txt').write_text(f'{n} {sys.argv[1]} rank {os.environ[\"RANK\"]}')\n"
    )
    env = child_env()
    env["PYTHONPATH"] = f"{site}:{ROOT}"
    env.update(
        CLUSTER_SPEC=spec("workerpool0", 0).replace(
            "cmle-training-workerpool0-ab12-0", "127.0.0.1"
        ),
        AIP_MODEL_DIR=f"gs://{gcs.bucket_name}/runs/s1/model/",
    )
    cwd = tmp_path / "replica"
    cwd.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "gputrain_node.vertex_entry", "jobs/count.py", "two words"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"runs {root / 'jobs' / 'count.py'} in {root}" in done.stdout
    assert gcs.names("runs/s1/model/") == ["runs/s1/model/answer.txt"]
    assert gcs.read("runs/s1/model/answer.txt") == b"42 two words rank 0"
    assert (cwd / "out" / "answer.txt").is_file()  # GPUTRAIN_OUT: the replica's own dir


_FORWARD = (
    "import sys\nfrom gputrain_node.vertex_entry import run_forwarding_signals\n"
    "print('started', flush=True)\nsys.exit(run_forwarding_signals(sys.argv[1:]))\n"
)


@pytest.mark.parametrize("worker_s", [0, 6], ids=["workers-gone", "a-worker-still-saving"])
def test_a_torchrun_deaf_to_the_stop_is_killed_only_once_its_workers_are_gone(
    worker_s: int,
) -> None:
    """A stand-in torchrun that ignores SIGTERM, as one blocked in its exit barrier does; with
    `worker_s`, a worker of its own that still runs that long (a checkpoint being saved)."""
    agent = (
        "import signal, subprocess, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"w = subprocess.Popen(['sleep', '{worker_s}']) if {worker_s} else None\n"
        "print('deaf', flush=True)\n"
        "sys.exit(w.wait()) if w is not None else time.sleep(300)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", _FORWARD, sys.executable, "-c", agent],
        cwd=ROOT, env=child_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    assert proc.stdout.readline().strip() == "deaf"  # it ignores SIGTERM by now
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=60)[0]
    took = time.monotonic() - signalled
    if worker_s:  # its worker ran to the end; so did it
        assert proc.returncode == 0 and "exit barrier" not in out
        assert took > worker_s - 2
    else:
        assert proc.returncode == 128 + signal.SIGKILL
        assert "torchrun's workers have ended and it still waits for other nodes" in out
        assert took < 10


def test_a_project_with_its_own_trainer_package_runs_and_mirrors_its_out_dir(
    gcs: GcsEmulator, tmp_path: Path
) -> None:
    """A user project whose code lives in `trainer/` (one of ML's most common package names):
    the job's package carries it instead of gputrain's, so the entry imports nothing of
    `trainer` for itself, runs `-m trainer.train` as the user's own code and mirrors its out
    dir (gputrain's reference trainer would checkpoint on its own). Installed as Vertex
    installs it: pip, offline, into a directory that alone is on the path."""
    from scripts.targets.vertex.job import build_sdist

    work = tmp_path / "work"
    (work / "trainer").mkdir(parents=True)
    (work / "trainer" / "__init__.py").write_text("")
    (work / "trainer" / "train.py").write_text(
        "import os, sys\nfrom pathlib import Path\nimport trainer\n"
        "out = Path(os.environ['GPUTRAIN_OUT']); out.mkdir(parents=True, exist_ok=True)\n"
        "(out / 'weights.txt').write_text(f'{sys.argv[1]} from {trainer.__file__}')\n"
    )
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    archive, _ = build_sdist(work, tmp_path / "dist", trainer_dir=ROOT / "trainer", limit_mib=10)
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation",
         "--no-deps", "--target", str(site), str(archive)],
        check=True,
    )  # fmt: skip
    assert not (site / "trainer" / "config.py").exists()  # gputrain's trainer did not travel
    env = child_env()
    env["PYTHONPATH"] = str(site)  # the job's package alone, as on Vertex
    env.update(
        CLUSTER_SPEC=spec("workerpool0", 0).replace(CHIEF, "127.0.0.1"),
        AIP_MODEL_DIR=f"gs://{gcs.bucket_name}/runs/u1/model/",
        GPUTRAIN_OUT_URI=f"gs://{gcs.bucket_name}/runs/u1/out/",
    )
    cwd = tmp_path / "replica"
    cwd.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "gputrain_node.vertex_entry", "-m", "trainer.train", "v1"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    user_trainer = site / "gputrain_code" / "files" / "trainer" / "__init__.py"  # the code dir
    assert gcs.read("runs/u1/model/weights.txt") == f"v1 from {user_trainer}".encode()
    assert "runs/u1/out/chief/weights.txt" in gcs.names("runs/u1/out/")  # mirrored
