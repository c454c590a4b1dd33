"""Where a job runs: the `Target` protocol (base.py) with one module or folder per target —
`gce/` (a Pulumi stack of VMs), `vertex/` (a Pulumi stack whose jobs run on Vertex AI), both on
what every stack target shares (`stack/`), `hosts.py` (a hosts file), `local.py` (this machine) —
sharing the SSH fleet session (session.py) where there are machines. The command line picks one
(scripts/cli_options.py's `open_target`)."""
