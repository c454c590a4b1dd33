"""What every target made of a Pulumi stack shares (GCE VMs in gce/, Vertex AI jobs in vertex/)."""
