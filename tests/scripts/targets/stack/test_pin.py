"""`pin`: the spec `up` creates with a capacity list's mode and a `gpus` candidate pinned, from
the stack file's config alone: pure (nothing is written), the same spec when nothing changes."""

from __future__ import annotations

from infra.spec import parse_spec
from infra.stackfile import NS
from scripts.targets.stack.target import pin

LADDER = {
    "gcp:project": "proj-test",
    NS + "gpus": "L4:1",
    NS + "regions": '["us-central1"]',
    NS + "capacity": '["spot", "on-demand"]',
}


def test_nothing_to_pin_is_the_same_spec() -> None:
    spec = parse_spec(LADDER, "p")
    assert spec.capacity == "spot" and spec.capacity_ladder == ("spot", "on-demand")
    assert pin(spec, LADDER) is spec
    assert pin(spec, LADDER, capacity="spot") is spec
    assert pin(spec, LADDER, candidate=spec.candidates[0]) is spec  # the stack's own choice


def test_a_mode_and_a_candidate_pinned_together() -> None:
    spec = parse_spec(LADDER, "p")
    on_demand = pin(spec, LADDER, capacity="on-demand")
    assert on_demand.capacity == "on-demand" and not on_demand.spot
    assert on_demand == parse_spec(LADDER | {NS + "capacityInUse": "on-demand"}, "p")
    other = next(c for c in on_demand.candidates if c.zone != on_demand.zone)
    moved = pin(on_demand, LADDER, candidate=other)
    assert (moved.zone, moved.machine_type, moved.capacity) == (
        other.zone,
        other.machine_type,
        "on-demand",  # the rung's mode stays pinned with the candidate
    )
    assert LADDER.get(NS + "capacityInUse") is None  # the config given is not changed
