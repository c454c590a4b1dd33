"""infra/outputs.py: the stack outputs contract the components write and every reader parses
(one-line errors for malformed outputs), and the fleet the controller builds from them."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from infra.base.errors import GputrainError
from infra.outputs import StackOutputError, parse_stack_outputs
from tests.support.fake_stack import sample_outputs


def _broken(mutate: Any) -> dict[str, Any]:
    out = copy.deepcopy(sample_outputs("dev", "us-central1-a", nodes=2))
    mutate(out)
    return out


@pytest.mark.parametrize(
    ("outputs", "message"),
    [
        (_broken(lambda o: o.pop("sshUser")), "sshUser is None; expected str"),
        (_broken(lambda o: o.update(nodes=[])), "nodes is []; expected a non-empty list"),
        (
            _broken(lambda o: o.update(gpusPerNode=1.5)),
            "gpusPerNode is 1.5; expected a whole number",
        ),
        (_broken(lambda o: o.update(gpusPerNode=True)), "gpusPerNode is True"),
        (_broken(lambda o: o["nodes"][1].update(role="boss")), "nodes[1].role is 'boss'"),
        (_broken(lambda o: o["nodes"][0].update(role="worker")), "exactly one head, first"),
        (_broken(lambda o: o["nodes"][1].update(externalIp="")), "nodes[1].externalIp is ''"),
        (_broken(lambda o: o["nodes"][0].pop("internalIp")), "nodes[0].internalIp is None"),
        (_broken(lambda o: o.update(nodes=["dev-node-0"])), "nodes[0] is 'dev-node-0'"),
    ],
)
def test_malformed_outputs_are_one_line_errors(outputs: dict[str, Any], message: str) -> None:
    with pytest.raises(StackOutputError) as err:
        parse_stack_outputs(outputs)
    assert message in str(err.value)


def test_outputs_to_fleet_pins_keys_and_expects_the_gpus() -> None:
    parsed = parse_stack_outputs(sample_outputs("dev", "us-central1-a", nodes=2))
    keys = {n.name: (f"ssh-ed25519 KEY{i}",) for i, n in enumerate(parsed.nodes)}
    fleet = parsed.to_fleet("stack-dev", keys, identity_file=Path("/k"))
    assert fleet.target == "stack-dev"
    assert fleet.head.name == "dev-node-0" and fleet.head.address == parsed.nodes[0].external_ip
    assert fleet.nodes[1].address is None  # workers reached through the head
    assert fleet.nodes[1].host_keys == ("ssh-ed25519 KEY1",)
    assert fleet.expect.count == parsed.gpus_per_node and fleet.expect.model == parsed.gpu_model
    assert 0 < fleet.expect.min_memory_mib < parsed.gpu_memory_gb * 1024
    with pytest.raises(GputrainError, match="no pinned SSH host keys for dev-node-1"):
        parsed.to_fleet("stack-dev", {"dev-node-0": ("k",)}, identity_file=None)


def test_drift_names_what_the_stack_file_says_now_that_the_cluster_up_is_not() -> None:
    """A stack file edited since `up` (4 on-demand nodes -> 1 spot node): every difference that
    sets what the cluster costs, in one list; an output an older program lacks is not compared."""
    from infra.outputs import Key, drift
    from infra.spec import parse_spec
    from tests.support.pulumi_mocks import deployable_config

    def spec(**overrides: str) -> Any:
        shape = {"machineType": "g2-standard-8", "maxRunDuration": "6h", **overrides}
        return parse_spec(deployable_config("dev", **shape), "dev")

    up = spec(nodes="4", capacity="on-demand")
    outputs = {
        Key.NODES: sample_outputs("dev", up.zone, nodes=4)[Key.NODES],
        Key.NODE_COUNT: up.nodes,
        Key.MACHINE_TYPE: up.machine_type,
        Key.GPUS_PER_NODE: up.gpus_per_node,
        Key.SPOT: up.spot,
        Key.MAX_RUN_DURATION_S: up.max_run_duration_s,
    }
    assert drift(up, outputs) == []
    assert drift(spec(nodes="1", capacity="spot"), outputs) == [
        "nodes: 4 up, 1 in the file",
        "capacity: not spot up, spot in the file",
    ]
    assert drift(spec(nodes="4", capacity="on-demand", maxRunDuration="8h"), outputs) == [
        "maxRunDuration: 6h up, 8h in the file"
    ]
    older = {Key.NODES: outputs[Key.NODES], Key.MAX_RUN_DURATION_S: 21600}
    assert drift(spec(nodes="1", capacity="spot"), older) == ["nodes: 4 up, 1 in the file"]


def _disk_outputs(**disks: Any) -> dict[str, Any]:
    """A g2-standard-8 stack's outputs with its nodes' disks recorded."""
    base = {"bootDiskType": "pd-ssd", "bootDiskGb": 500, "localSsdCount": 1, "localSsdGib": 375}
    return sample_outputs("dev", "us-central1-a", nodes=2) | base | disks


def test_disks_are_read_back_and_an_older_stack_has_none() -> None:
    """The disks the caps price, as `up` made them; a stack `up` by an older gputrain did not
    record them (None: the stack file's are assumed); malformed ones are one line."""
    from infra.outputs import StackDisks

    assert parse_stack_outputs(_disk_outputs()).disks == StackDisks("pd-ssd", 500, 1, 375)
    bundled_unknown = _disk_outputs(localSsdCount=0, localSsdGib=None)
    assert parse_stack_outputs(bundled_unknown).disks == StackDisks("pd-ssd", 500, 0, None)
    assert parse_stack_outputs(sample_outputs("dev", "us-central1-a")).disks is None
    for bad, message in [
        ({"bootDiskGb": "500"}, "stack output bootDiskGb is '500'; expected int or float"),
        ({"bootDiskType": ""}, "stack output bootDiskType is ''; expected str"),
        ({"localSsdCount": 1.5}, "stack output localSsdCount is 1.5; expected a whole number"),
        ({"localSsdGib": -375}, "stack output localSsdGib is -375; expected a whole number"),
    ]:
        with pytest.raises(StackOutputError, match=re.escape(message)):
            parse_stack_outputs(_disk_outputs(**bad))


def test_drift_names_each_disk_edited_since_up() -> None:
    """The boot disk's type and size and the Local SSDs the caps price: one "KEY: X up, Y in the
    file" each; a stack whose outputs lack them is not compared (the file's are assumed)."""
    from infra.outputs import drift
    from infra.spec import parse_spec
    from tests.support.pulumi_mocks import deployable_config

    def spec(**disks: str) -> Any:
        shape = {"machineType": "g2-standard-8", "nodes": "2", "maxRunDuration": "1h"}
        return parse_spec(deployable_config("dev", **shape, **disks), "dev")

    up = spec(bootDiskType="pd-ssd", bootDiskGb="500", localSsdCount="1")
    assert drift(up, _disk_outputs()) == []
    assert drift(spec(), _disk_outputs()) == [
        "bootDiskType: pd-ssd up, pd-balanced in the file",
        "bootDiskGb: 500 up, 200 in the file",
        "localSsdCount: 1 up, 0 in the file",
    ]
    assert drift(spec(), sample_outputs("dev", "us-central1-a")) == []
