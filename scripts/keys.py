"""SSH key pairs for a stack, made once by `gputrain keygen` (never inside the Pulumi program)."""

from __future__ import annotations


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
