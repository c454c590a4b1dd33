"""The bottom layer: errors, shared records, polling and validation used by `infra` and `scripts`.

It imports nothing from the rest of gputrain, so the Pulumi program never loads the controller.
"""
