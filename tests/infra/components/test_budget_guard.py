"""`billingBudget` under the Pulumi mocks: a Cloud Billing budget on the stack's label whose
every update goes to the stack's Pub/Sub topic, a pull subscription on it, and the nodes'
service account a subscriber on that subscription only; none of it without the key, and a bad
value is one line before anything is declared."""

from __future__ import annotations

import json
from typing import Any

import pulumi

from infra.permissions import spec_resource_types
from infra.spec import parse_spec
from tests.support.program import expect_declares_nothing, run_main
from tests.support.pulumi_mocks import (
    IAM_MEMBER,
    TEST_PROJECT,
    Registered,
    deployable_config,
    pulumi_mocks,
)

BUDGET = "gcp:billing/budget:Budget"
TOPIC = "gcp:pubsub/topic:Topic"
SUBSCRIPTION = "gcp:pubsub/subscription:Subscription"
READER = "gcp:pubsub/subscriptionIAMMember:SubscriptionIAMMember"
ACCOUNT = "012345-6789AB-CDEF01"


def _declared(config: dict[str, str]) -> list[Registered]:
    with pulumi_mocks({}, stack="dev") as m:

        @pulumi.runtime.test
        def run() -> Any:
            cluster = run_main(config, "dev")["cluster"]
            return pulumi.Output.all(**cluster.exports())

        run()
        return list(m.resources)


def _one(resources: list[Registered], typ: str) -> Registered:
    found = [r for r in resources if r.typ == typ]
    assert len(found) == 1, [r.name for r in found]
    return found[0]


def test_the_guard_is_a_labelled_budget_notifying_the_stacks_topic() -> None:
    config = deployable_config("dev", billingBudget=json.dumps({"account": ACCOUNT, "usd": 250.5}))
    resources = _declared(config)
    topic, sub = _one(resources, TOPIC), _one(resources, SUBSCRIPTION)
    budget, reader = _one(resources, BUDGET), _one(resources, READER)
    assert topic.inputs["name"] == sub.inputs["name"] == "gputrain-dev-budget"
    assert topic.inputs["project"] == sub.inputs["project"] == TEST_PROJECT
    assert sub.inputs["topic"] == budget.inputs["allUpdatesRule"]["pubsubTopic"]
    assert "ackDeadlineSeconds" in sub.inputs and "pushConfig" not in sub.inputs  # a pull one
    assert budget.inputs["billingAccount"] == ACCOUNT
    assert budget.inputs["budgetFilter"]["labels"] == {"gputrain-stack": "dev"}
    assert budget.inputs["budgetFilter"]["calendarPeriod"] == "MONTH"
    amount = budget.inputs["amount"]["specifiedAmount"]
    assert (amount["currencyCode"], amount["units"], amount["nanos"]) == ("USD", "250", 500000000)
    assert [t["thresholdPercent"] for t in budget.inputs["thresholdRules"]] == [0.5, 0.9, 1.0]
    # the nodes' account reads that subscription, and gets no project-wide Pub/Sub role
    assert reader.inputs["role"] == "roles/pubsub.subscriber"
    assert reader.inputs["subscription"] == "gputrain-dev-budget"
    assert (
        reader.inputs["member"]
        == f"serviceAccount:gputrain-dev@{TEST_PROJECT}.iam.gserviceaccount.com"
    )
    assert not [r for r in resources if r.typ == IAM_MEMBER and "pubsub" in r.inputs["role"]]
    # and `doctor` asks for what exactly these types need
    declared = {r.typ for r in resources if r.custom and not r.typ.startswith("pulumi:providers:")}
    # the budget through a provider that bills the project (a user's ADC gets 403 otherwise)
    provider = _one(resources, "pulumi:providers:gcp")
    assert provider.inputs["billingProject"] == TEST_PROJECT
    assert provider.inputs["userProjectOverride"] in (True, "true")
    assert declared == set(spec_resource_types(parse_spec(config, "dev")))


def test_no_guard_without_the_key() -> None:
    config = deployable_config("dev")
    resources = _declared(config)
    assert not [r for r in resources if r.typ.startswith(("gcp:pubsub/", "gcp:billing/"))]
    assert not {TOPIC, BUDGET} & set(spec_resource_types(parse_spec(config, "dev")))


def test_a_bad_guard_is_one_line_and_declares_nothing() -> None:
    for value, line in (
        ({"account": "nope", "usd": 5}, "gputrain:billingBudget.account 'nope': not a billing"),
        ({"account": ACCOUNT, "usd": 0}, "gputrain:billingBudget.usd '0': not an amount"),
        ({"account": ACCOUNT}, "gputrain:billingBudget.usd is not set"),
        ({"account": ACCOUNT, "usd": 5, "eur": 1}, "gputrain:billingBudget.eur: not a setting"),
    ):
        message = expect_declares_nothing(
            deployable_config("dev", billingBudget=json.dumps(value)), "dev"
        )
        assert message.startswith(line), message
