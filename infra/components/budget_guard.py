"""The project-wide guard (`billingBudget`): a Cloud Billing budget on the stack's label whose
every update goes to a Pub/Sub topic of the stack; the head's watchdog pulls the topic's one
subscription (with `roles/pubsub.subscriber` on it, nothing more) and ends the run once the billed
cost reaches the budget. Nothing of ours idles: Google sends, the watchdog reads while a run runs.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from infra.billing import BillingBudget, guard_name
from infra.components import STACK_LABEL

SUBSCRIBER_ROLE = "roles/pubsub.subscriber"
THRESHOLDS = (0.5, 0.9, 1.0)  # the emails Cloud Billing sends its billing admins too


class BudgetGuard(pulumi.ComponentResource):
    """The topic, the budget that notifies it, the pull subscription the nodes may read."""

    def __init__(
        self,
        stack: str,
        project: str,
        budget: BillingBudget,
        member: pulumi.Input[str],
        opts: pulumi.ResourceOptions,
    ) -> None:
        super().__init__("gputrain:infra:BudgetGuard", f"{stack}-budget-guard", None, opts)
        child = pulumi.ResourceOptions(parent=self)
        name = guard_name(stack)
        self.topic = gcp.pubsub.Topic(
            f"{stack}-budget-topic", name=name, project=project, opts=child
        )
        self.subscription = gcp.pubsub.Subscription(
            f"{stack}-budget-subscription",
            name=name,
            project=project,
            topic=self.topic.id,
            ack_deadline_seconds=60,
            message_retention_duration="86400s",  # a day: a run reads what came while it ran
            opts=child,
        )
        self.reader = gcp.pubsub.SubscriptionIAMMember(
            f"{stack}-budget-reader",
            project=project,
            subscription=self.subscription.name,
            role=SUBSCRIBER_ROLE,
            member=member,
            opts=child,
        )
        # pulumi_gcp's Budget docs: with a user's ADC, the Billing Budgets API answers 403
        # unless the provider names a billing_project with user_project_override
        billing = gcp.Provider(
            f"{stack}-billing",
            project=project,
            billing_project=project,
            user_project_override=True,
            opts=child,
        )
        self.budget = gcp.billing.Budget(
            f"{stack}-budget",
            billing_account=budget.account,
            display_name=name,
            budget_filter=gcp.billing.BudgetBudgetFilterArgs(
                labels={STACK_LABEL: stack}, calendar_period="MONTH"
            ),
            amount=gcp.billing.BudgetAmountArgs(
                specified_amount=gcp.billing.BudgetAmountSpecifiedAmountArgs(
                    currency_code="USD", units=str(int(budget.usd)), nanos=_nanos(budget.usd)
                )
            ),
            threshold_rules=[
                gcp.billing.BudgetThresholdRuleArgs(threshold_percent=t) for t in THRESHOLDS
            ],
            all_updates_rule=gcp.billing.BudgetAllUpdatesRuleArgs(
                pubsub_topic=self.topic.id, schema_version="1.0"
            ),
            opts=pulumi.ResourceOptions(parent=self, provider=billing),
        )
        self.register_outputs({"subscription": self.subscription.id})


def _nanos(usd: float) -> int:
    """The amount's fraction of a dollar in nanos (the API's Money). Pure."""
    return round((usd - int(usd)) * 1_000_000_000)
