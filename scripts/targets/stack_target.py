"""What every target made of a Pulumi stack shares — GCE VMs (gce/) or Vertex AI jobs (vertex.py):
the stack file it validates, the one StackRunner it drives, its results dir name and `plan`."""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from infra.base.errors import UserError
from scripts import ui
from scripts.guard import SignalGuard, signal_guard
from scripts.settings import Settings
from scripts.targets.base import RunOptions, Session
from scripts.targets.gce.stack import target_name

if TYPE_CHECKING:
    from collections.abc import Mapping

    from infra.offer_tables import Check
    from infra.offers import Candidate
    from infra.spec import ClusterSpec
    from scripts.job.environment import EnvironmentSettings
    from scripts.targets.gce.clients import GceClients
    from scripts.targets.gce.stack import StackRunner


class StackClients(Protocol):
    def runner(self, stack: str, root: Path) -> StackRunner: ...


C = TypeVar("C", bound=StackClients)


class StackTarget(Generic[C]):
    def __init__(self, stack: str, settings: Settings, clients: C) -> None:
        self.stack = stack
        self.name = target_name(stack)
        self.settings = settings
        self.clients = clients
        self._runner: StackRunner | None = None

    @property
    def runner(self) -> StackRunner:
        if self._runner is None:
            self._runner = self.clients.runner(self.stack, self.settings.root)
        return self._runner

    def spec(self) -> ClusterSpec:
        from infra.spec import parse_spec
        from infra.stackfile import load_stack_config

        return parse_spec(load_stack_config(self.settings.root, self.stack), self.stack)

    def spec_at(self, chosen: Candidate) -> ClusterSpec:
        """The spec with a `gpus` candidate pinned (`candidate` + `zone`), as `up` pins it."""
        from infra.placement import candidate_label
        from infra.spec import parse_spec
        from infra.stackfile import NS, load_stack_config

        config = load_stack_config(self.settings.root, self.stack)
        config |= {NS + "candidate": candidate_label(chosen), NS + "zone": chosen.zone}
        return parse_spec(config, self.stack)

    def _spec_with_project(self) -> ClusterSpec:
        """The spec of a stack that can have resources: gcp:project must be set."""
        spec = self.spec()
        if not spec.project:
            raise UserError(f"gcp:project is not set for stack {self.stack}")
        return spec

    def provisioned(self, opts: RunOptions, guard: SignalGuard) -> AbstractContextManager[Session]:
        raise NotImplementedError

    def environment_settings(self) -> EnvironmentSettings:
        """The stack's `setup`, `secrets` and `image` keys (gputrain reads them; the program
        does not)."""
        from infra.stackfile import GCP_PROJECT_KEY, NS, load_stack_config
        from scripts.job.environment import (
            EnvironmentSettings,
            file_setting_names,
            file_setting_text,
        )

        config = load_stack_config(self.settings.root, self.stack)
        secrets = file_setting_names(config.get(NS + "secrets"), "gputrain:secrets")
        vertex = config.get(NS + "backend") == "vertex"
        return EnvironmentSettings(
            setup="" if vertex else file_setting_text(config.get(NS + "setup"), "gputrain:setup"),
            secrets=secrets,
            image=config.get(NS + "image", "").strip(),
            project=config.get(GCP_PROJECT_KEY) or None,
            source="gputrain:",
            backend_without_ssh="vertex" if vertex else None,
        )

    def check_before_spending(
        self, spec: ClusterSpec, opts: RunOptions, doctor: GceClients
    ) -> None:
        """Before anything is created: a money prompt someone can answer (or --yes), then
        `gputrain doctor`'s table, stopping on a failed row (unless --skip-preflight)."""
        if not opts.yes:
            require_terminal(spec)
        if not opts.skip_preflight:
            from scripts.doctor.run import run_doctor

            report = run_doctor(self.stack, self.settings.root, doctor)
            report.show()
            report.require_ok("doctor")

    def up(self, opts: RunOptions) -> None:
        """Create and prove; it stays up. If that fails it is destroyed again."""
        with signal_guard() as guard, self.provisioned(opts, guard) as session:
            session.verify(fabric=True)
            session.keep = True

    def candidate_checks(self, spec: ClusterSpec) -> Mapping[Candidate, Check] | None:
        """Preflight verdicts on a `gpus` stack's candidates; None where none can be had."""
        return None

    def plan(self) -> None:
        from infra.plan import HEADERS, build_plan

        spec = self.spec()
        checks = self.candidate_checks(spec)
        plan = build_plan(spec, checks)
        chosen = plan.candidates.chosen if plan.candidates else None
        if chosen is not None and (chosen.machine_type, chosen.zone) != (
            spec.machine_type,
            spec.zone,
        ):
            plan = build_plan(self.spec_at(chosen), checks)  # the cheapest that passes preflight
        ui.table(plan.title, HEADERS, [plan.row])
        if plan.candidates is not None:
            shown = plan.candidates
            ui.table(
                f"candidates for gpus = {spec.gpus_request} "
                f"({'Spot' if spec.spot else 'on-demand'}; ranked: fewest nodes, then $/h)",
                list(shown.headers),
                [list(r) for r in shown.rows],
            )
            if shown.footer:
                ui.say(shown.footer)
            if checks is None:
                ui.say(
                    "preflight: not checked here (needs gcp:project and Google credentials; "
                    f"`gputrain doctor --stack {spec.stack}`); `up` checks before creating"
                )
            if shown.chosen is None:
                ui.warn("no candidate passed preflight: see the reasons above")
        for line in plan.footer_lines():
            ui.say(line)


def require_terminal(spec: ClusterSpec) -> None:
    """Without a terminal nobody can answer the money prompt: a nohup or CI run must say --yes."""
    if sys.stdin.isatty():
        return
    from infra.offer_tables import money
    from infra.plan import build_plan

    plan = build_plan(spec)
    raise UserError(
        f"stdin is not a terminal, so nobody can confirm spending ~{money(plan.hourly_total)}/h "
        f"(at most {money(plan.worst_case)}) on stack {spec.stack}: pass --yes to proceed; "
        "nothing was created"
    )


def confirm(spec: ClusterSpec, *, yes: bool) -> None:
    """Ask before spending money (require_terminal made sure someone can answer)."""
    if yes:
        return
    from infra.plan import build_plan

    plan = build_plan(spec)
    shape = f"{spec.nodes} x {spec.machine_type} ({spec.gpus_per_node} x {spec.gpu_model} each)"
    if spec.on_vertex:
        what = f"run Vertex AI jobs of {shape}: {plan.cost} per job before Vertex cuts it off"
    else:
        what = f"create {shape}: {plan.cost} before the VMs delete themselves"
    ui.say(f"About to {what}.")
    if input("Proceed? [y/N] ").strip().lower() not in ("y", "yes"):
        raise UserError("cancelled; nothing was created")
