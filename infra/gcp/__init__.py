"""The only infra code that calls Google: thin adapters over the Compute, Cloud Storage, IAM,
Resource Manager and Service Usage clients, returning plain dataclasses (api.py builds the clients
and maps their errors)."""
