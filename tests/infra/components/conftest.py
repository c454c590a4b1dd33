"""The Pulumi program's tests: `mocks`, a fresh loop + runtime + SDK mocks + the dev stack's
config; the test body declares the resources."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from infra.stackfile import load_stack_config
from tests.support import ROOT
from tests.support.pulumi_mocks import GcpMocks, pulumi_mocks


@pytest.fixture
def mocks() -> Iterator[GcpMocks]:
    with pulumi_mocks(load_stack_config(ROOT, "dev")) as m:
        yield m
