"""The doctor's checks of the stack's own settings that a first `up` needs: the SSH key pair
(`gputrain keygen`) and `sshSourceRanges` holding this machine's public address. The address
cannot be known offline, so its lookup is a function the caller passes (tests pass their own);
when it fails the row is "unknown"."""

from __future__ import annotations

import ipaddress
import os
import urllib.request

from infra.keys import whole_internet
from infra.spec import ClusterSpec
from infra.stackfile import StackSecrets
from scripts.doctor.report import Row
from scripts.transport.hostkeys import fingerprint, parse_public_key

PUBLIC_ADDRESS_URL = "https://api.ipify.org"  # answers this machine's public IPv4 address
PUBLIC_ADDRESS_ENV = "GPUTRAIN_PUBLIC_IP"  # set it to skip the lookup (offline, or a proxy)


def lookup_public_address(timeout_s: float = 3.0) -> str | None:
    """This machine's public IPv4 address as the internet sees it, or None when it cannot tell."""
    text = os.environ.get(PUBLIC_ADDRESS_ENV, "")
    if not text:
        try:
            with urllib.request.urlopen(PUBLIC_ADDRESS_URL, timeout=timeout_s) as answer:
                text = answer.read(64).decode("ascii", "replace")
        except (OSError, ValueError):
            return None
    try:
        return str(ipaddress.IPv4Address(text.strip()))
    except ValueError:
        return None


def ssh_key_row(spec: ClusterSpec, secrets: StackSecrets) -> Row:
    name, keygen = "SSH key", f"gputrain keygen --stack {spec.stack}"
    if not spec.ssh_public_key:
        return Row(name, "fail", "gputrain:sshPublicKey is not set", keygen)
    if "gputrain:sshPrivateKey" not in secrets.secure_keys:
        return Row(
            name,
            "fail",
            f"the public key is set, but Pulumi.{spec.stack}.yaml has no gputrain:sshPrivateKey "
            "secret to log in with",
            f"{keygen} --force",
        )
    kind, blob = parse_public_key(spec.ssh_public_key)
    return Row(name, "ok", f"{kind} {fingerprint(blob)}; the private key is a stack secret")


def source_ranges_row(spec: ClusterSpec, address: str | None) -> Row:
    """`address` is this machine's public address (None: unknown)."""
    name, ranges = "sshSourceRanges", list(spec.ssh_source_ranges)
    index = len(ranges)
    here = f"{address}/32" if address else '"$(curl -s https://api.ipify.org)/32"'
    add = (
        f"pulumi config set --path 'gputrain:sshSourceRanges[{index}]' {here} --stack {spec.stack}"
    )
    if not ranges:
        return Row(name, "fail", "empty: nobody could reach the head over SSH", add)
    listed = ", ".join(ranges)
    if whole_internet(ranges):
        return Row(name, "warn", f"{listed}: SSH is open to anyone (allowSshFromAnywhere)")
    if address is None:
        return Row(
            name,
            "unknown",
            f"{listed}; this machine's public address could not be looked up",
            f"make sure it holds this machine's address (or set {PUBLIC_ADDRESS_ENV})",
        )
    ip = ipaddress.IPv4Address(address)
    inside = next((r for r in ranges if ip in ipaddress.IPv4Network(r, strict=False)), None)
    if inside:
        return Row(name, "ok", f"this machine ({address}) is in {inside}")
    return Row(name, "fail", f"this machine ({address}) is not in {listed}", add)


def reconcile_state_row(spec: ClusterSpec, backend: str | None, secrets: StackSecrets) -> Row:
    """Laptop-closed recovery runs `pulumi refresh/up` in a Cloud Run job: the stack's state must
    be in a `gs://` backend and its secrets under a cloud KMS provider the job's account can
    use (a local backend or a passphrase stays on this machine). Asked only where `recover` is
    on."""
    name = "reconcile job's state"
    fix = (
        f"pulumi login gs://BUCKET and `pulumi stack change-secrets-provider --stack {spec.stack} "
        "gcpkms://projects/P/locations/L/keyRings/R/cryptoKeys/K`, or recover: never"
    )
    if backend is None:
        return Row(name, "unknown", "the Pulumi backend is unknown (see the row above)", fix)
    if not backend.startswith("gs://"):
        return Row(
            name, "fail", f"the state is in {backend}, which the Cloud Run job cannot read", fix
        )
    if not (secrets.provider or "").startswith("gcpkms://"):
        return Row(
            name,
            "fail",
            f"the stack's secrets use {secrets.provider or 'a passphrase'}, which the job lacks",
            fix,
        )
    return Row(name, "ok", f"state in {backend}, secrets under gcpkms://")
