"""What runs cost: the ledger every run appends to (ledger.py), `gputrain cost` (command.py) and
the Cloud Billing export's real figures (billing.py)."""
