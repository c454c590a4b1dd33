"""infra/ttl.py: what is left of a VM's TTL, and the shorter one a recovery's re-created VM gets."""

from __future__ import annotations

import time

import pytest

from infra.outputs import parse_stack_outputs
from infra.stackfile import SpecError
from infra.ttl import (
    GCE_MIN_RUN_S,
    RECREATE_DEADLINE_ENV,
    RECREATE_IMAGE_ENV,
    RECREATE_KEEP_ENV,
    RECREATE_ZONE_ENV,
    Recreation,
    ttl_left_s,
)
from tests.support.fake_stack import sample_outputs


def test_ttl_left_counts_from_the_latest_start() -> None:
    now = time.time()
    started = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(now - 600))
    assert ttl_left_s(started, 3600, now) == pytest.approx(3000, abs=1)
    assert ttl_left_s(started, 60, now) == 0
    assert ttl_left_s(None, 3600, now) is None


def test_a_recreation_reaches_the_program_as_written_and_a_plain_up_has_none() -> None:
    """The controller's env is what the program reads back: the deadline to the last digit."""
    made = Recreation(1_767_225_600.123456, "us-central1-a", keep=("dev-node-0", "dev-node-2"))
    env = made.env()
    assert set(env) == {RECREATE_DEADLINE_ENV, RECREATE_ZONE_ENV, RECREATE_KEEP_ENV}
    assert env[RECREATE_KEEP_ENV] == "dev-node-0,dev-node-2"
    assert Recreation.from_env({"PATH": "/bin", **env}) == made
    assert Recreation.from_env({"PATH": "/bin"}) is None
    none_kept = Recreation(1_767_225_600.0, "us-central1-a")
    assert Recreation.from_env(none_kept.env()) == none_kept


def test_a_recreation_keeps_only_the_vms_that_stand_untouched_in_its_zone() -> None:
    """The survivors (every node the recovery did not lose) keep their maxRunDuration; a lost
    one, or one declared in another zone (the cluster moved: replaced), gets what is left."""
    cluster = parse_stack_outputs(sample_outputs("dev", "us-central1-a", nodes=3))
    again = Recreation.of(cluster, 1_767_225_600.0, ["dev-node-1"])
    assert again.keep == ("dev-node-0", "dev-node-2") and again.zone == "us-central1-a"
    assert again.keeps("dev-node-0", "us-central1-a")
    assert not again.keeps("dev-node-1", "us-central1-a")  # lost: created anew
    assert not again.keeps("dev-node-0", "us-central1-b")  # moved: replaced


def test_after_a_round_moved_vms_to_another_zone_none_is_kept() -> None:
    """An `up` in another zone replaced the VMs that stood (or some of them, when it failed):
    from then on no VM is known to stand untouched in the recreation's zone; rounds there alone
    keep what stood and add what they made."""
    a, b = "us-central1-a", "us-central1-b"
    again = Recreation(1_767_225_600.0, a, keep=("dev-node-0",))
    assert again.after([(a, ("dev-node-1",))]).keep == ("dev-node-0", "dev-node-1")
    assert again.after([(a, ()), (b, ())]).keep == ()  # made nothing there, yet tried to move
    moved = again.after([(a, ("dev-node-1",)), (b, ("dev-node-0",))])
    assert moved.keep == () and moved.deadline == again.deadline and moved.zone == a
    assert moved.after([(a, ("dev-node-2",))]).keep == ("dev-node-2",)  # made there since


def test_a_recreation_carries_the_image_the_cluster_runs_when_its_outputs_record_one() -> None:
    """The program boots every VM of a recovery's `up` on that image; a stack whose outputs
    have none (an older `up`) sends none, and the program resolves the family as before."""
    image = "https://www.googleapis.com/compute/v1/projects/p/global/images/pytorch-v20260301"
    made = Recreation(1_767_225_600.0, "us-central1-a", image)
    assert made.env()[RECREATE_IMAGE_ENV] == image
    assert Recreation.from_env(made.env()) == made
    older = Recreation(1_767_225_600.0, "us-central1-a")
    assert RECREATE_IMAGE_ENV not in older.env()
    assert Recreation.from_env({**older.env(), RECREATE_IMAGE_ENV: ""}) == older


def test_a_recreated_vm_gets_what_is_left_to_the_deadline_never_less_than_gces_minimum() -> None:
    now = 1_000_000.0
    assert Recreation(now + 1800.9, "z").max_run_duration_s(now) == 1800  # never past it
    assert Recreation(now + 5, "z").max_run_duration_s(now) == GCE_MIN_RUN_S == 30
    assert Recreation(now - 60, "z").max_run_duration_s(now) == GCE_MIN_RUN_S


def test_a_deadline_that_is_no_number_is_one_line() -> None:
    with pytest.raises(SpecError) as caught:
        Recreation.from_env({RECREATE_DEADLINE_ENV: "soon"})
    assert str(caught.value) == (
        "GPUTRAIN_RECREATE_DEADLINE = 'soon': allowed: Unix seconds (a recovery sets it)"
    )
