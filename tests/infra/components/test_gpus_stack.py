"""`gpus:` stacks: the Pulumi program (under SDK mocks) resolves the request from the catalog alone
and declares exactly the resolution's machine type, node count and zone."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

from infra import offers
from infra.disk_prices import cluster_hourly, spec_disk_rate
from infra.spec import parse_spec
from tests.support.program import check_family, expect_declares_nothing, run_main
from tests.support.pulumi_mocks import INSTANCE, GcpMocks, deployable_config, pulumi_mocks


def _program(config: dict[str, str], stack: str) -> tuple[GcpMocks, dict[str, Any]]:
    """Run __main__.py under mocks; (the mocks with what was declared, the stack outputs)."""
    with pulumi_mocks({}, stack=stack) as m:
        got: dict[str, Any] = {}

        @pulumi.runtime.test
        def run() -> Any:
            cluster = run_main(config, stack)["cluster"]
            return pulumi.Output.all(**cluster.exports()).apply(got.update)

        run()
        return m, got


def _gpus(stack: str = "gpus", **overrides: str) -> dict[str, str]:
    return deployable_config(stack, **overrides)


@pytest.mark.parametrize(
    ("overrides", "machine_type", "nodes"),
    [
        ({}, "a3-highgpu-8g", 2),  # Pulumi.gpus.yaml: H100:16, Spot, three regions
        ({"gpus": "A100:16", "regions": '["us-central1"]'}, "a2-megagpu-16g", 1),
        (
            {"gpus": "80GB+:8", "spot": "false", "regions": "[]", "zones": '["us-central1-a"]'},
            "a2-ultragpu-8g",
            1,
        ),
        ({"gpus": "T4:4", "regions": '["us-central1"]', "bootDiskGb": "200"}, "n1-standard-32", 1),
        ({"gpus": '["H200:16", "B200:8"]', "regions": "[]"}, None, None),
    ],
    ids=["h100-16", "a100-16", "80gb-plus-on-demand", "t4-4-attached", "a-list"],
)
def test_program_declares_what_the_request_resolves_to(
    overrides: dict[str, str], machine_type: str | None, nodes: int | None
) -> None:
    cfg = _gpus(**overrides)
    spec = parse_spec(cfg, "gpus")
    request = offers.parse_request(cfg["gputrain:gpus"].strip("[]").replace('"', ""))
    ranked = offers.resolve(
        request,
        spot=spec.spot,
        zones=spec_list(cfg, "zones"),
        regions=spec_list(cfg, "regions"),
    )
    best = ranked[0]
    assert (spec.machine_type, spec.nodes, spec.zone) == (best.machine_type, best.nodes, best.zone)
    if machine_type is not None:
        assert (spec.machine_type, spec.nodes) == (machine_type, nodes)
    assert spec.candidates == tuple(ranked)
    m, out = _program(cfg, "gpus")
    check_family(m, spec, out)  # instances, their machine type and zone, GPUs, firewall, ...
    vms = m.of_type(INSTANCE)
    assert len(vms) == best.nodes
    assert {v.inputs["machineType"] for v in vms} == {best.machine_type}
    assert {v.inputs["zone"] for v in vms} == {best.zone}
    assert (out["machineType"], out["nodeCount"], out["zone"]) == (
        best.machine_type,
        best.nodes,
        best.zone,
    )
    assert out["gpusTotal"] == best.total_gpus and out["gpusRequest"] == cfg["gputrain:gpus"]
    assert out["region"] == best.region
    # the run's rate: the candidate's VMs and their disks, as the caps count it
    rate = cluster_hourly(spec)
    assert out["hourlyPriceUsd"] == (None if rate is None else pytest.approx(rate, abs=1e-3))
    if (
        rate is not None
        and best.hourly is not None
        and not spec_disk_rate(spec, spec.spot).unpriced
    ):
        assert rate > best.hourly


def spec_list(cfg: dict[str, str], key: str) -> list[str]:
    import json

    return list(json.loads(cfg.get(f"gputrain:{key}", "[]") or "[]"))


def test_failover_keys_pin_another_candidate_and_the_program_follows() -> None:
    """`up` moves down the list by setting `candidate` and `zone`; the program declares that one."""
    base = _gpus(gpus="80GB+:8", regions='["us-central1"]')
    ranked = parse_spec(base, "gpus").candidates
    other = next(c for c in ranked if c.machine_type != ranked[0].machine_type)
    cfg = {**base, "gputrain:candidate": f"{other.machine_type} x 1", "gputrain:zone": other.zone}
    spec = parse_spec(cfg, "gpus")
    assert (spec.machine_type, spec.zone) == (other.machine_type, other.zone)
    m, out = _program(cfg, "gpus")
    assert {v.inputs["machineType"] for v in m.of_type(INSTANCE)} == {other.machine_type}
    assert out["zone"] == other.zone


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"machineType": "a3-highgpu-8g", "gpus": "H100:16"},
            "gputrain:gpus = 'H100:16': set either gpus or machineType (+ nodes), not both",
        ),
        (
            {"gpus": "H100:16", "gputrain:nodes": "2"},
            "gputrain:gpus = 'H100:16': gpus decides the machine type and node count: remove "
            "gputrain:nodes",
        ),
        (
            {"gpus": "H100:12", "spot": "false", "regions": "[]"},
            "gputrain:gpus = 'H100:12': no machine type x nodes (up to 64) gives exactly 12 x "
            "H100 on demand; nearest counts that work: 8 or 16",
        ),
        (
            {"gpus": "H101:8"},
            "gputrain:gpus = 'H101:8': unknown GPU model 'H101' (did you mean H100?)",
        ),
        (
            {"gpus": "H200:8", "spot": "false"},
            "gputrain:gpus = 'H200:8': H200 is not sold on demand",
        ),
        (
            {"gpus": "H100:8", "regions": '["mars-north1"]'},
            "gputrain:gpus = 'H100:8': no allowed zone offers H100",
        ),
        ({"regions": '["us central"]'}, "gputrain:regions = 'us central': allowed: region names"),
        (
            {"candidate": "a2-highgpu-8g x 2"},
            "gputrain:candidate = 'a2-highgpu-8g x 2': allowed: empty or one of a3-highgpu-8g x 2",
        ),
        (
            {"zone": "us-west1-a"},
            "gputrain:zone = 'us-west1-a': allowed: empty or a candidate's zone",
        ),
    ],
    ids=[
        "gpus-with-machine-type",
        "gpus-with-nodes",
        "impossible-count",
        "unknown-model",
        "not-sold-on-demand",
        "no-zone-offers-it",
        "bad-region",
        "candidate-not-in-the-list",
        "zone-not-a-candidates",
    ],
)
def test_bad_gpus_config_is_one_line_naming_the_key_and_declares_nothing(
    overrides: dict[str, str], expected: str
) -> None:
    cfg = _gpus()
    cfg.update({k if ":" in k else f"gputrain:{k}": v for k, v in overrides.items()})
    message = expect_declares_nothing(cfg, "gpus")
    assert message.startswith(expected), message


def test_machine_type_stacks_keep_working_and_the_default_request_is_l4_1() -> None:
    h100 = parse_spec(deployable_config("h100"), "h100")  # machineType + nodes, no gpus
    assert (h100.machine_type, h100.nodes, h100.gpus_request, h100.candidates) == (
        "a3-highgpu-8g",
        2,
        "",
        (),
    )
    bare = parse_spec({}, "bare")  # nothing set: Pulumi.yaml's default gpus: L4:1
    assert bare.gpus_request == "L4:1" and (bare.gpus_per_node, bare.nodes) == (1, 1)
    assert bare.zone == bare.candidates[0].zone  # the cheapest zone anywhere


def test_vertex_stacks_resolve_gpus_to_a_shape_vertex_runs() -> None:
    """On Vertex AI the request resolves the same way, skipping shapes Vertex does not run."""
    cfg = deployable_config("vertex", gpus="H100:8", **{"gputrain:machineType": ""})
    cfg["gputrain:nodes"] = "0"
    spec = parse_spec(cfg, "vertex")
    assert spec.on_vertex and spec.machine_type == "a3-highgpu-8g" and spec.nodes == 1
