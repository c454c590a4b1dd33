"""A torchrun job on a fleet: what it is (records), the shell on the nodes (node_scripts), shipping
the code (sync), launching (launch), following (follow), why it failed (diagnosis) and bringing
the results home (download)."""
