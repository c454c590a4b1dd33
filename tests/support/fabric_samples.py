"""NIC names the fabric nodes show, shared by the fabric setup and check tests.

A3 Mega: enp0s12 + the 8 GPU gVNICs of Cluster Toolkit's a3-megagpu-8g run-nccl-tests.sh.
A4 / A3 Ultra: enp0s19, enp192s20 gVNICs (CT a3-ultragpu-8g nccl-tests) and gpu0rdma0..7 (the
mlx5 netdev names GKE's DRANET exposes).
"""

MEGA_PRIMARY = "enp0s12"
MEGA_GPU_NICS = (
    "enp6s0",
    "enp7s0",
    "enp13s0",
    "enp14s0",
    "enp134s0",
    "enp135s0",
    "enp141s0",
    "enp142s0",
)
A4_GVNICS = ("enp0s19", "enp192s20")
A4_RDMA_NICS = tuple(f"gpu{i}rdma0" for i in range(8))


def a4_pci(i: int) -> str:
    """The PCI address of MRDMA NIC i (ascending with i, as on the VM)."""
    return f"0000:{0x81 + 12 * i:02x}:00.0"
