"""The stack's SSH key pair: made once by `gputrain keygen` (never inside the Pulumi program), the
private half kept as a Pulumi secret and, while the controller runs, in a 0600 temp file."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.base.errors import UserError
from infra.stackfile import qualify
from scripts.targets.gce.stack import StackRunner

PUBLIC_KEY = qualify("sshPublicKey")
PRIVATE_KEY = qualify("sshPrivateKey")


def generate_ssh_keypair(comment: str) -> tuple[str, str]:
    """A new ed25519 key pair: (private key in OpenSSH PEM, public key as an authorized_keys line).

    Only the public line goes into the stack config unencrypted; the private PEM is stored as a
    Pulumi secret and in a 0600 file on the operator's machine.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if any(c.isspace() for c in comment):
        raise ValueError(f"SSH key comment must not contain whitespace: {comment!r}")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.OpenSSH,
        encryption_algorithm=serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(
            encoding=serialization.Encoding.OpenSSH, format=serialization.PublicFormat.OpenSSH
        )
        .decode()
    )
    return private_pem, f"{public} {comment}" if comment else public


def store_new_keypair(runner: StackRunner, stack: str) -> None:
    """Generate a pair and store it in the stack config: the public line plain, the private PEM
    as a secret."""
    private, public = generate_ssh_keypair(f"gputrain-{stack}")
    runner.set_config(PUBLIC_KEY, public)
    runner.set_config(PRIVATE_KEY, private, secret=True)


@contextmanager
def private_key_file(runner: StackRunner, stack: str) -> Iterator[Path]:
    """The stack's private key in a 0600 file of a 0700 temp dir, removed afterwards."""
    pem = runner.get_config(PRIVATE_KEY)
    if not pem:
        raise UserError(
            f"{PRIVATE_KEY} is not set for stack {stack}; run `gputrain keygen --stack {stack}`"
        )
    d = Path(tempfile.mkdtemp(prefix="gputrain-key-"))
    path = d / "id_ed25519"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
        with os.fdopen(fd, "w") as f:
            f.write(pem if pem.endswith("\n") else pem + "\n")
        yield path
    finally:
        shutil.rmtree(d, ignore_errors=True)
