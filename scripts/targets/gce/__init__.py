"""The GCE target: a Pulumi stack of GPU VMs, reached over SSH."""
