"""Capacity modes: what each machine type is offered in, what each mode sets, one-line errors."""

from __future__ import annotations

import pytest

from infra import capacity, catalog
from infra.base.errors import UserError
from infra.capacity import capacity_errors, instance_capacity, offered, resolved_capacity

DAY = 86400


def errors(machine_type: str = "a4-highgpu-8g", ttl: int = 6 * 3600, **settings: str) -> list[str]:
    return capacity_errors(machine_type, max_run_duration_s=ttl, **settings)


@pytest.mark.parametrize(
    ("machine_type", "modes"),
    [
        ("a4-highgpu-8g", ("spot", "flex-start", "reservation")),
        ("a3-ultragpu-8g", ("spot", "flex-start", "reservation")),
        ("a3-megagpu-8g", ("on-demand", "spot", "flex-start", "reservation")),
        ("a3-highgpu-8g", ("on-demand", "spot", "flex-start", "reservation")),
        ("a3-highgpu-2g", ("spot", "flex-start")),
        ("a2-highgpu-8g", ("on-demand", "spot", "flex-start", "reservation")),
        ("g2-standard-4", ("on-demand", "spot", "flex-start", "reservation")),
        ("n1-standard-8", ("on-demand", "spot", "reservation")),
    ],
)
def test_offered_capacity_per_machine_type(machine_type: str, modes: tuple[str, ...]) -> None:
    assert offered(catalog.MACHINE_TYPES[machine_type]) == modes


def test_every_catalog_type_offers_spot_and_every_offer_is_a_known_mode() -> None:
    for mt in catalog.MACHINE_TYPES.values():
        modes = offered(mt)
        assert "spot" in modes, mt.name
        assert set(modes) <= set(capacity.CAPACITIES)
        assert capacity.MODES.keys() == set(capacity.CAPACITIES)


@pytest.mark.parametrize(
    ("cap", "spot", "expected"),
    [
        ("", "", "spot"),  # neither set: what the old default spot: true meant
        ("", "true", "spot"),
        ("", "false", "on-demand"),
        ("", "False", "on-demand"),
        ("reservation", "", "reservation"),
        ("flex-start", "false", "flex-start"),
    ],
)
def test_capacity_resolves_from_capacity_or_its_spot_alias(
    cap: str, spot: str, expected: str
) -> None:
    assert resolved_capacity(cap, spot) == expected
    name = "res-1" if expected == "reservation" else ""
    assert errors("a2-highgpu-1g", capacity=cap, spot=spot, reservation=name) == []


@pytest.mark.parametrize(
    ("cap", "spot", "message"),
    [
        ("bogus", "", "gputrain:capacity = 'bogus': allowed: on-demand, spot"),
        ("Spot", "", "gputrain:capacity = 'Spot': allowed: on-demand, spot, flex-start, reservation; did you mean spot?"),
        ("", "maybe", "gputrain:spot = 'maybe': allowed: true or false"),
    ],
)  # fmt: skip
def test_text_that_names_no_mode_is_refused_not_read_as_the_default(
    cap: str, spot: str, message: str
) -> None:
    with pytest.raises(capacity.CapacityError) as e:
        resolved_capacity(cap, spot)
    assert str(e.value).startswith(message)
    assert isinstance(e.value, UserError) and e.value.exit_code == 2  # one line, not a traceback


def test_valid_settings_have_no_errors() -> None:
    assert errors(capacity="reservation", reservation="a4-res-1") == []
    assert (
        errors(capacity="reservation", reservation="projects/host-proj-1/reservations/shared") == []
    )
    assert errors(capacity="flex-start", ttl=7 * DAY) == []
    assert errors(capacity="spot", spot="true") == []
    assert errors("a3-megagpu-8g", capacity="on-demand", spot="false") == []


def one(errs: list[str]) -> str:
    assert len(errs) == 1, errs
    assert "\n" not in errs[0]
    return errs[0]


def test_unknown_capacity_names_the_setting_and_suggests() -> None:
    msg = one(errors(capacity="ondemand"))
    assert msg.startswith(
        "gputrain:capacity = 'ondemand': allowed: on-demand, spot, flex-start, reservation"
    )
    assert "did you mean on-demand?" in msg


def test_reservation_without_a_name() -> None:
    msg = one(errors(capacity="reservation"))
    assert msg.startswith("gputrain:reservation = '': capacity reservation needs the name")


def test_reservation_name_is_checked_and_only_used_with_capacity_reservation() -> None:
    assert one(errors(capacity="reservation", reservation="My_Res")).startswith(
        "gputrain:reservation = 'My_Res': allowed: a reservation name"
    )
    msg = one(errors(capacity="spot", reservation="a4-res-1"))
    assert (
        msg
        == "gputrain:reservation = 'a4-res-1': only used with capacity reservation (capacity is spot)"
    )


def test_flex_start_over_seven_days() -> None:
    msg = one(errors(capacity="flex-start", ttl=8 * DAY, max_run_duration_text="8d"))
    assert (
        msg
        == "gputrain:maxRunDuration = '8d': Flex-start VMs run at most 7 days; allowed: up to 7d"
    )
    # Without the text the value is still shown readably; other modes may run longer.
    assert "'10d'" in one(errors(capacity="flex-start", ttl=10 * DAY))
    assert errors(capacity="reservation", reservation="r", ttl=30 * DAY) == []


def test_capacity_the_machine_type_is_not_offered_in() -> None:
    msg = one(errors(capacity="on-demand"))
    assert msg == (
        "gputrain:capacity = 'on-demand': a4-highgpu-8g is not offered as on-demand; "
        "allowed capacity: spot, flex-start, reservation"
    )
    # Through the alias, the error names the setting the user wrote.
    assert one(errors("a3-ultragpu-8g", spot="false")).startswith(
        "gputrain:spot = 'false': a3-ultragpu-8g"
    )
    assert one(errors("n1-standard-8", capacity="flex-start")).startswith(
        "gputrain:capacity = 'flex-start'"
    )
    assert one(errors("a3-highgpu-4g", capacity="reservation", reservation="r")).startswith(
        "gputrain:capacity = 'reservation': a3-highgpu-4g is not offered as reservation"
    )


@pytest.mark.parametrize(
    ("cap", "spot"), [("reservation", "true"), ("spot", "false"), ("on-demand", "true")]
)
def test_spot_contradicting_capacity(cap: str, spot: str) -> None:
    msgs = errors(
        "a3-megagpu-8g", capacity=cap, spot=spot, reservation="r" if cap == "reservation" else ""
    )
    assert msgs[0] == (
        f"gputrain:spot = '{spot}': contradicts gputrain:capacity = '{cap}'; remove spot "
        "(capacity replaces it)"
    )


def test_spot_must_be_a_boolean_and_machine_type_known() -> None:
    assert one(errors(spot="yes")).startswith("gputrain:spot = 'yes': allowed: true or false")
    assert one(errors("a9-fastgpu-8g")).startswith("gputrain:machineType = 'a9-fastgpu-8g'")


def test_reservation_on_a4_and_a3_ultra_is_reservation_bound_with_specific_affinity() -> None:
    for mt in ("a4-highgpu-8g", "a3-ultragpu-8g"):
        ic = instance_capacity("reservation", mt, max_run_duration_s=6 * 3600, reservation="res-1")
        assert ic.provisioning_model == "RESERVATION_BOUND"
        assert ic.reservation_affinity == capacity.ReservationAffinity(
            "SPECIFIC_RESERVATION", "compute.googleapis.com/reservation-name", ("res-1",)
        )
        assert not ic.preemptible
        assert ic.instance_termination_action == "DELETE"
        assert ic.placement_policy is False  # the reservation places the VMs
        assert ic.preemptible_quota is None  # no GPU quota check: the reservation holds it


def test_reservation_on_other_series_is_standard_unless_dense() -> None:
    ic = instance_capacity("reservation", "a2-highgpu-8g", max_run_duration_s=3600, reservation="r")
    assert ic.provisioning_model == "STANDARD"
    assert ic.reservation_affinity is not None and ic.reservation_affinity.values == ("r",)
    dense = instance_capacity(
        "reservation",
        "a3-megagpu-8g",
        max_run_duration_s=3600,
        reservation="r",
        dense_reservation=True,
    )
    assert dense.provisioning_model == "RESERVATION_BOUND"
    with pytest.raises(capacity.CapacityError, match="gputrain:reservation"):
        instance_capacity("reservation", "a2-highgpu-8g", max_run_duration_s=3600)


def test_flex_start_sets_flex_start_delete_no_restart_no_reservation() -> None:
    ic = instance_capacity("flex-start", "a3-megagpu-8g", max_run_duration_s=2 * DAY)
    assert (ic.provisioning_model, ic.instance_termination_action) == ("FLEX_START", "DELETE")
    assert ic.automatic_restart is False and ic.preemptible is False
    assert ic.max_run_duration_s == 2 * DAY
    assert ic.reservation_affinity == capacity.ReservationAffinity("NO_RESERVATION")
    assert ic.placement_policy is False and ic.preemptible_quota is True
    with pytest.raises(capacity.CapacityError, match="maxRunDuration = '8d'"):
        instance_capacity("flex-start", "a3-megagpu-8g", max_run_duration_s=8 * DAY)


def test_spot_and_on_demand_keep_todays_scheduling() -> None:
    spot = instance_capacity("spot", "g2-standard-4", max_run_duration_s=3600)
    assert (spot.provisioning_model, spot.preemptible, spot.automatic_restart) == (
        "SPOT",
        True,
        False,
    )
    assert spot.reservation_affinity is None and spot.placement_policy and spot.preemptible_quota
    od = instance_capacity("on-demand", "g2-standard-4", max_run_duration_s=3600)
    assert (od.provisioning_model, od.preemptible, od.automatic_restart) == (
        "STANDARD",
        False,
        True,
    )
    assert od.preemptible_quota is False and od.on_host_maintenance == "TERMINATE"


def test_field_names_are_pulumi_gcp_instance_arguments() -> None:
    """The component passes these straight to pulumi-gcp 10.x; a renamed argument fails here."""
    import pulumi_gcp as gcp

    ic = instance_capacity("reservation", "a4-highgpu-8g", max_run_duration_s=3600, reservation="r")
    kwargs = ic.scheduling_args()
    seconds = kwargs.pop("max_run_duration")
    args = gcp.compute.InstanceSchedulingArgs(
        **kwargs,  # type: ignore[arg-type]
        max_run_duration=gcp.compute.InstanceSchedulingMaxRunDurationArgs(seconds=seconds),  # type: ignore[arg-type]
    )
    assert args.provisioning_model == "RESERVATION_BOUND"
    assert args.max_run_duration.seconds == 3600
    ra = ic.reservation_affinity
    assert ra is not None
    affinity = gcp.compute.InstanceReservationAffinityArgs(
        type=ra.type,
        specific_reservation=gcp.compute.InstanceReservationAffinitySpecificReservationArgs(
            key=ra.key or "", values=list(ra.values)
        ),
    )
    assert affinity.specific_reservation.key == capacity.RESERVATION_NAME_KEY
