"""What the Vertex target adds to the stack client bag: Vertex AI and Cloud Logging (tests point
them at tests/support/fake_vertex.py), and how often it polls a running job."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scripts.targets.stack.clients import StackClients, from_env

if TYPE_CHECKING:
    from scripts.targets.vertex.api import VertexApi


@dataclass
class VertexClients(StackClients):
    vertex_endpoint: str | None = field(default_factory=from_env("GPUTRAIN_VERTEX_ENDPOINT"))
    logging_endpoint: str | None = field(default_factory=from_env("GPUTRAIN_LOGGING_ENDPOINT"))
    poll_s: float = 15.0  # between GETs of a running job (and its new log lines)
    settle_s: float = 5.0  # Cloud Logging delivers a job's last lines a few seconds late
    cancel_timeout_s: float = 600.0  # from CancelCustomJob until the job has ended
    _apis: dict[tuple[str, str], VertexApi] = field(default_factory=dict, init=False, repr=False)

    def api(self, project: str, region: str) -> VertexApi:
        if (project, region) not in self._apis:
            from scripts.targets.vertex.api import VertexApi

            self._apis[project, region] = VertexApi(
                project,
                region,
                api_endpoint=self.vertex_endpoint,
                logging_endpoint=self.logging_endpoint,
            )
        return self._apis[project, region]
