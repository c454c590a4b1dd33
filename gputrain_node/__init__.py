"""gputrain's node agent: what runs on the nodes beside any trainer (fetch, out-dir mirror,
watchdog, GPU telemetry, health check, the Vertex AI entry). The controller starts it only
through gputrain_node/contract.py; it imports nothing of the controller's."""
