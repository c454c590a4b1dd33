"""The Vertex AI entry point: CLUSTER_SPEC (and Vertex's env) -> torchrun argv, errors in one line."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from trainer.errors import InputError
from trainer.vertex_entry import Placement, parse_cluster_spec, placement_from_env, torchrun_argv


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
            "job": '{"python_module":"trainer.vertex_entry"}',
            **extra,
        }
    )


CHIEF = "cmle-training-workerpool0-ab12-0"


def test_one_replica_runs_standalone_with_one_process_per_gpu() -> None:
    placement = parse_cluster_spec(spec("workerpool0", 0))
    assert placement == Placement(1, 0, CHIEF, 2222, "workerpool0[0]")
    argv = torchrun_argv(placement, 8, ["--preset", "gpt2-124m"])
    assert argv == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=8",
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
