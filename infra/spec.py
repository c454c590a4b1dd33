"""Stack config -> validated, frozen ClusterSpec: the only view of gputrain's settings.

Every bad value raises SpecError with one line: the key, the bad value and what is allowed.
Nothing here imports pulumi, so `gputrain plan` and the tests use it without the SDK.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from infra import capacity as modes
from infra import catalog, keys, offers, vertex
from infra.base.errors import UserError
from infra.base.records import GpuExpectation
from infra.billing import BillingBudget, guard_setting, parse_table, parse_usd
from infra.capacity import capacity_in_use, read_capacity
from infra.datasets import Dataset, parse_datasets
from infra.fabric import FabricPlan, read_fabric
from infra.keys import CHECK, check_keys, format_duration, read_autodown
from infra.offers import Candidate, ZonePrice
from infra.placement import place
from infra.reconciler import JobReach, parse_every, parse_recover
from infra.schema import SettingTypeError, StackSettings
from infra.scratch import SCRATCH_MOUNT
from infra.secret_refs import parse_secrets, secret_grants
from infra.stackfile import (
    DEFAULT_IMAGE_FAMILY,
    DEFAULT_IMAGE_PROJECT,
    DEFAULTS,
    GCP_PROJECT_KEY,
    NS,
    SpecError,
    StackFile,
    check_stack_name,
    load_config_strings,
    meant_key,
)
from infra.vertex_jobspec import job_spec_path
from infra.vertex_pools import (
    Chief,
    PoolShape,
    ReductionServer,
    parse_chief,
    parse_reduction_server,
    stack_pool_shapes,
)

#: The image A3 Ultra / A4 RDMA stacks get when imageFamily/imageProject are left at their
#: defaults. Google's "Run NCCL on Compute Engine instances": "If you are using standard OS
#: images, you must also install the latest NVIDIA DOCA-OFED driver" for gIB; its accelerator
#: images (Ubuntu accelerator, as Cluster Toolkit's A3 Ultra/A4 blueprints use) carry it. Deep
#: Learning VM images are standard OS images, so RDMA stacks default to the accelerator image
#: (driver only: PyTorch is pip-installed on each VM before verify).
RDMA_IMAGE = ("ubuntu-os-accelerator-images", "ubuntu-accelerator-2204-amd64-with-nvidia-580")
RDMA_IMAGE_WHY = (
    "gIB needs NVIDIA's DOCA-OFED driver on standard OS images such as Deep Learning VM "
    "images (Google's NCCL page); the Ubuntu accelerator image has it"
)


# ---- local SSD as the nodes' scratch disk (infra/scratch.py mounts it): machine types that bundle
# local NVMe (A2 Ultra, A3, A4) get all of it; N1 and G2 may add some (`localSsdCount`) ----------

LOCAL_SSD_GIB = 375  # one local SSD partition
#: bundle local SSD whose size our sources leave open (facts sheet: UNCONFIRMED)
BUNDLED_SIZE_UNKNOWN = ("a3-ultragpu-8g", "a4-highgpu-8g")
#: N1: the counts Compute Engine takes (docs: 1-8, 16 or 24 partitions of 375 GiB)
N1_COUNTS = (*range(1, 9), 16, 24)


@dataclass(frozen=True)
class Scratch:
    """A node's local SSD: how many disks we declare (0: none or bundled), its size."""

    declared_disks: int
    gib: int | None  # None: bundled, size unknown
    bundled: bool

    @property
    def present(self) -> bool:
        return self.bundled or self.declared_disks > 0

    @property
    def node_gib(self) -> int | None:
        """A node's Local SSD as its price counts it: 0 none; None bundled, size unknown."""
        return self.gib if self.present else 0

    def describe(self) -> str:
        if not self.present:
            return "none (boot disk only; N1/G2: localSsdCount)"
        size = f"{self.gib:,} GiB" if self.gib is not None else "size unknown"
        how = (
            "bundled with the machine type" if self.bundled else f"{self.declared_disks} x 375 GiB"
        )
        return f"{size} local NVMe SSD ({how}), RAID 0 at {SCRATCH_MOUNT}"


NO_SCRATCH = Scratch(0, None, False)


def allowed_counts(mt: catalog.MachineType) -> tuple[int, ...]:
    """The `localSsdCount` values a machine type takes besides 0 (none: bundled or not offered)."""
    if mt.series == "n1":
        return N1_COUNTS
    if mt.series == "g2":
        # the docs' maximum local SSD per G2 type, in 375 GiB partitions (facts sheet §1.3)
        most = {4: 1, 8: 1, 12: 1, 16: 1, 24: 2, 32: 1, 48: 4, 96: 8}[mt.vcpus]
        return tuple(range(1, most + 1))
    return ()


def scratch_for(mt: catalog.MachineType, count: int) -> Scratch:
    """`localSsdCount` checked against the machine type (one line naming it otherwise)."""
    bundled = mt.local_ssd_gib is not None or mt.name in BUNDLED_SIZE_UNKNOWN
    if count == 0:
        return Scratch(0, mt.local_ssd_gib, True) if bundled else Scratch(0, None, False)
    if bundled:
        raise CHECK.fail(
            "localSsdCount",
            str(count),
            f"allowed: 0 ({mt.name} brings its own local SSD, all of it used)",
        )
    counts = allowed_counts(mt)
    if count not in counts:
        allowed = (
            f"allowed for {mt.name}: 0 or {', '.join(map(str, counts))}"
            if counts
            else f"allowed: 0 ({mt.name} takes no local SSD here; N1 and G2 do)"
        )
        raise CHECK.fail("localSsdCount", str(count), allowed)
    return Scratch(count, count * LOCAL_SSD_GIB, False)


@dataclass(frozen=True)
class ClusterSpec:
    """Everything the cluster needs, validated: the only view of the stack config."""

    stack: str
    project: str | None
    zones: tuple[str, ...]
    zone: str
    region: str
    machine_type: str
    series: str
    accelerator: str
    gpus_per_node: int
    gpu_model: str
    gpu_memory_gb: int
    vcpus: int
    memory_gb: float
    nodes: int
    spot: bool
    max_run_duration_s: int
    image_family: str
    image_project: str
    boot_disk_gb: int
    boot_disk_type: str
    ssh_user: str
    ssh_public_key: str | None
    ssh_source_ranges: tuple[str, ...]
    allow_ssh_from_anywhere: bool
    public_ip: Literal["head", "all", "none"]
    placement: Literal["compact", "none"]
    network: str | None
    labels: Mapping[str, str]
    gvnic: bool
    attach_gpus: bool  # N1: GPUs go in guest_accelerators; A/G series bring their own
    existing_bucket: str | None = None  # `bucket`: the user's bucket; None = the stack's own
    bucket_prefix: str = ""  # "" or "a/b/": where runs/<run-id>/ go in the bucket
    bucket_retention_days: int = 30  # the stack's own bucket deletes objects this old
    backend: Literal["gce", "vertex"] = "gce"
    executor_image: str = vertex.DEFAULT_EXECUTOR_IMAGE  # backend vertex: the training container
    ignored: tuple[str, ...] = ()  # keys set in the stack that this backend does not read
    gpus_request: str = ""  # `gpus` as written; "" when the stack names its machineType
    candidates: tuple[Candidate, ...] = ()  # gpus: every candidate, best first (plan, failover)
    capacity: modes.Capacity = "spot"  # `spot` above is capacity == "spot"
    reservation: str | None = None  # capacity reservation: the specific reservation's name
    fabric: FabricPlan | None = None  # the GPU network; None only for specs built by hand
    stall_timeout_s: int | None = None  # stallTimeout; None: automatic (infra/keys.py)
    capacity_ladder: tuple[modes.Capacity, ...] = ()  # `capacity` as a list: tried in order
    reservation_bound: bool | None = None  # reservationBound; None: `up` reads the reservation
    wait_for_capacity_s: int = 0  # waitForCapacity: how long `up` retries stock-outs
    datasets: tuple[Dataset, ...] = ()  # `data`: what every job reads (the nodes may read these)
    scratch: Scratch = NO_SCRATCH  # local SSD (bundled, or localSsdCount)
    autodown_s: int | None = 600  # the head's watchdog deletes the VMs this long after the end
    recover: str = "auto"  # laptop-closed recovery: auto, always, never (infra/reconciler.py)
    reconcile_every_s: int = 120  # reconcileEvery: Cloud Scheduler's period for the job
    # where a reconcile job would find the stack's state and secrets (not a stack key: the
    # environment's PULUMI_BACKEND_URL and the stack file's secretsprovider); None: unknown.
    # Not part of what the stack is: two specs of the same stack compare equal without it.
    job_reach: JobReach | None = field(default=None, compare=False)
    notify: tuple[str, ...] = ()  # webhook URLs for run events (secrets: never printed in full)
    billing_export: str | None = None  # the Cloud Billing export table `cost` reads billed from
    budget: float | None = None  # USD one run may cost (infra/billing.py)
    max_hourly_cost: float | None = None  # USD per hour the cluster may cost at most
    billing_budget: BillingBudget | None = None  # Cloud Billing budget guard (infra/billing.py)
    build: str = ""  # a Dockerfile gputrain builds into the stack's registry (infra/image_build.py)
    # (project, secret id) of each `secrets` entry from Secret Manager: the account that reads
    # them itself (a Vertex job's, a GCE stack's reconcile job's) gets secretAccessor on these only
    secret_access: tuple[tuple[str, str], ...] = ()
    # vertex: pool 0's own machine, worker pool 2's reducers, a user's CustomJobSpec file
    chief: Chief | None = None
    reduction_server: ReductionServer | None = None
    vertex_job_spec: str = ""  # a path relative to the project directory; "" = the stack keys
    restart_job_on_worker_restart: bool = False  # vertex: one replica restarted restarts them all

    @functools.cached_property  # read by every quota metric: computed once per spec
    def instance_capacity(self) -> modes.InstanceCapacity:
        """What the capacity mode sets on every VM (scheduling, reservation affinity)."""
        return modes.instance_capacity(
            self.capacity,
            self.machine_type,
            max_run_duration_s=self.max_run_duration_s,
            reservation=self.reservation,
            dense_reservation=bool(self.reservation_bound),
        )

    @property
    def automatic_restart(self) -> bool:
        """Whether GCE restarts a VM that a host error or maintenance ended: the capacity allows
        it (not spot or flex-start) and there is no compact placement (which turns it off)."""
        return self.instance_capacity.automatic_restart and self.placement != "compact"

    @property
    def preemptible_quota(self) -> bool:
        """Spot and Flex-start draw on the PREEMPTIBLE_ quotas."""
        return bool(self.instance_capacity.preemptible_quota)

    @property
    def bucket_name(self) -> str | None:
        """The bucket checkpoints and results go to; None while gcp:project is unset."""
        if self.existing_bucket:
            return self.existing_bucket
        return stack_bucket_name(self.stack, self.project) if self.project else None

    @property
    def on_vertex(self) -> bool:
        return self.backend == "vertex"

    def vertex_pools(self) -> list[tuple[int, PoolShape]]:
        """A Vertex job's pools as the stack keys describe them: chief, workers, reducers."""
        return stack_pool_shapes(
            self.machine_type, self.accelerator, self.gpus_per_node, self.nodes, self.chief,
            self.reduction_server,
        )  # fmt: skip

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(f"{self.stack}-node-{i}" for i in range(self.nodes))

    @property
    def max_run_duration(self) -> str:
        return format_duration(self.max_run_duration_s)

    @property
    def price(self) -> ZonePrice | None:
        """One node in the chosen zone (Vertex: a replica in the region); None = unknown."""
        gpu = self.accelerator if self.attach_gpus else None
        count = self.gpus_per_node if gpu else 0
        if self.on_vertex:  # Compute Engine's price plus Vertex's training premium
            return vertex.vertex_price(self.machine_type, gpu, count, self.region)
        return offers.vm_price(self.machine_type, self.zone, gpu, count)

    @property
    def hourly_price_per_node(self) -> float | None:
        """USD per hour of one node in the stack's capacity mode; None = unknown, never 0."""
        return None if self.price is None else self.price.hourly(self.spot)

    @property
    def hourly_price(self) -> float | None:
        """USD per hour of every node together; None = unknown."""
        per_node = self.hourly_price_per_node
        return None if per_node is None else per_node * self.nodes

    @property
    def gpu_quota_metric(self) -> str:
        return catalog.quota_metric(self.accelerator, self.preemptible_quota)

    @property
    def cpu_quota_metric(self) -> str:
        return catalog.cpu_quota_metric(self.series, self.preemptible_quota)

    def gpu_expectation(self) -> GpuExpectation:
        """What nvidia-smi must show on every node: model, count, the catalog's memory floor."""
        return GpuExpectation(
            model=self.gpu_model,
            count=self.gpus_per_node,
            min_memory_mib=catalog.ACCELERATORS[self.accelerator].min_memory_mib,
        )


def parse_spec(
    config: Mapping[str, str], stack: str, *, given: Collection[str] = ()
) -> ClusterSpec:
    """Validate a fully qualified string config (see load_stack_config) into a ClusterSpec;
    `given`: the keys the stack file sets (the program's stack_file_keys), as `plan` reads them.

    Missing gcp:project, sshPublicKey and sshSourceRanges are accepted here so that `plan`
    works on the shipped stack files; `require_deployable` refuses them before `pulumi up`.
    """
    check_stack_name(stack)
    _only_known_keys(config)
    settings = settings_from_config(config, given)
    return spec_from_settings(settings, stack, config.get(GCP_PROJECT_KEY, "").strip() or None)


def stack_file_spec(stack_file: StackFile) -> ClusterSpec:
    """The ClusterSpec of a stack file read once (infra/stackfile.read_stack_file): its typed
    settings, not its strings parsed again."""
    check_stack_name(stack_file.stack)
    _only_known_keys(stack_file.config)
    project = stack_file.config.get(GCP_PROJECT_KEY, "").strip() or None
    return spec_from_settings(stack_file.settings, stack_file.stack, project)


def _only_known_keys(config: Mapping[str, str]) -> None:
    """A `gputrain:` key the schema does not know is one line with the one it likely meant."""
    unknown = sorted(k for k in config if k.startswith(NS) and k[len(NS) :] not in DEFAULTS)
    if unknown:
        meant = meant_key(unknown[0][len(NS) :])
        hint = f"; did you mean {meant}?" if meant else ""
        raise SpecError(
            f"{unknown[0]}: not a gputrain setting; allowed: {', '.join(DEFAULTS)}{hint}"
        )


def spec_from_settings(typed: StackSettings, stack: str, project: str | None) -> ClusterSpec:
    """The ClusterSpec of a stack's typed settings (read and checked once: infra/schema.py)
    and its gcp:project; one-line SpecError for the first rule a setting breaks."""
    check_stack_name(stack)
    keys = check_keys(typed, project)
    backend, settings, ttl = keys.backend, keys.settings, keys.max_run_duration_s
    # the mode as written (capacity, or its alias spot) ranks the candidates; read_capacity
    # validates it against the machine below
    mode = capacity_in_use(settings)
    every = modes.allowed_modes(settings)  # a gpus candidate must be sold in each of them
    where = place(settings, spot=mode == "spot", backend=backend, modes=every)
    mt, accelerator, gpus, attach, nodes = where.shape

    cap = read_capacity(settings, mt, ttl, settings.maxRunDuration, backend)
    spot = cap.capacity == "spot"
    if backend == "vertex":
        gpu = accelerator if attach else None
        problem = vertex.vertex_problem(mt.name, gpu, gpus if gpu else 0, spot=spot)
        if problem:
            raise SpecError(f"{NS}{problem} (backend vertex)")
        if mt.accelerator == "nvidia-b200" and keys.executor_image == (
            vertex.DEFAULT_EXECUTOR_IMAGE
        ):  # no newer prebuilt tag is confirmed, so no default to switch to: ask for one
            raise SpecError(
                f"{NS}executorImage = {vertex.DEFAULT_EXECUTOR_IMAGE!r}: PyTorch 2.4 / CUDA 12.1 "
                f"has no Blackwell kernels, so it cannot train on {mt.name} (B200 needs PyTorch "
                ">= 2.7 / CUDA 12.8); set executorImage to such a container (backend vertex)"
            )

    image_family, image_project = settings.imageFamily, settings.imageProject
    disk_type = settings.bootDiskType or catalog.default_boot_disk_type(mt)
    if disk_type not in catalog.boot_disk_types(mt):
        raise CHECK.fail(
            "bootDiskType",
            disk_type,
            f"allowed for {mt.name}: {', '.join(catalog.boot_disk_types(mt))}",
        )

    placement_raw = keys.placement
    own_policy = modes.instance_capacity(
        cap.capacity, mt.name, max_run_duration_s=ttl, reservation=cap.reservation
    ).placement_policy
    if placement_raw == "compact" and cap.capacity == "reservation":
        raise CHECK.fail(
            "placement",
            "compact",
            "capacity reservation: the reservation decides where its VMs run (a VM consuming it "
            "takes no placement policy of ours); use auto or none",
        )
    if placement_raw == "compact" and not mt.compact_placement:
        raise CHECK.fail(
            "placement",
            "compact",
            f"{mt.series.upper()} does not support compact placement; use none",
        )
    if placement_raw == "compact" and nodes < 2:
        raise CHECK.fail(
            "placement", "compact", "compact placement needs nodes >= 2; use none or auto"
        )
    placement: Literal["compact", "none"] = (
        "compact"
        if placement_raw == "compact"
        or (placement_raw == "auto" and nodes > 1 and mt.compact_placement and own_policy)
        else "none"
    )

    acc = catalog.ACCELERATORS[accelerator]
    fabric = read_fabric(
        settings, mt, nodes, zone=where.zone, project=project, existing_network=keys.network
    )
    rdma = fabric.enabled and fabric.kind == "rdma"
    if rdma and (image_project, image_family) == (DEFAULT_IMAGE_PROJECT, DEFAULT_IMAGE_FAMILY):
        image_project, image_family = RDMA_IMAGE  # left at the defaults: see RDMA_IMAGE_WHY
    pools = (
        _vertex_pools(settings, nodes, mt.name, spot) if backend == "vertex" else (None, None, "")
    )
    return ClusterSpec(
        stack=stack,
        project=project,
        zones=where.zones,
        zone=where.zone,
        region=catalog.region_of(where.zone),
        machine_type=mt.name,
        series=mt.series,
        accelerator=accelerator,
        gpus_per_node=gpus,
        gpu_model=acc.model,
        gpu_memory_gb=acc.memory_gb,
        vcpus=mt.vcpus,
        memory_gb=mt.memory_gb,
        nodes=nodes,
        spot=spot,
        max_run_duration_s=ttl,
        image_family=image_family,
        image_project=image_project,
        boot_disk_gb=keys.boot_disk_gb,
        boot_disk_type=disk_type,
        ssh_user=settings.sshUser,
        ssh_public_key=keys.ssh_public_key,
        ssh_source_ranges=keys.ssh_source_ranges,
        allow_ssh_from_anywhere=settings.allowSshFromAnywhere,
        public_ip=keys.public_ip,
        placement=placement,
        network=keys.network,
        labels=MappingProxyType(keys.labels),
        gvnic=mt.gvnic,
        attach_gpus=attach,
        existing_bucket=keys.existing_bucket,
        bucket_prefix=keys.bucket_prefix,
        bucket_retention_days=keys.bucket_retention_days,
        stall_timeout_s=keys.stall_timeout_s,
        autodown_s=None
        if backend == "vertex"
        else read_autodown(settings.autodown, ttl, "autodown" in typed.model_fields_set),
        recover=parse_recover(settings.recover) if backend == "gce" else "never",
        reconcile_every_s=parse_every(settings.reconcileEvery) if backend == "gce" else 120,
        notify=keys.notify,
        billing_export=billing_export(settings.billingExport),
        budget=parse_usd(settings.budget, f"{NS}budget"),
        max_hourly_cost=parse_usd(settings.maxHourlyCost, f"{NS}maxHourlyCost"),
        billing_budget=guard_setting(settings.billingBudget) if backend == "gce" else None,
        build=keys.build,
        secret_access=_secret_access(settings, project),
        backend=backend,
        executor_image=keys.executor_image,
        chief=pools[0],
        reduction_server=pools[1],
        vertex_job_spec=pools[2],
        restart_job_on_worker_restart=backend == "vertex" and settings.restartJobOnWorkerRestart,
        ignored=keys.ignored,
        gpus_request=where.request,
        candidates=where.candidates,
        capacity=cap.capacity,
        reservation=cap.reservation,
        capacity_ladder=cap.ladder,
        reservation_bound=cap.reservation_bound,
        wait_for_capacity_s=cap.wait_for_capacity_s,
        fabric=fabric,
        datasets=tuple(parse_datasets(settings.data)),
        scratch=scratch_for(mt, keys.local_ssd_count),
    )


def _vertex_pools(
    settings: StackSettings, nodes: int, machine_type: str, spot: bool
) -> tuple[Chief | None, ReductionServer | None, str]:
    """backend vertex: `chief`, `reductionServer` and `vertexJobSpec` (infra/vertex_pools.py)."""
    return (
        parse_chief(settings.chief, spot=spot),
        parse_reduction_server(settings.reductionServer, nodes=nodes, machine_type=machine_type),
        job_spec_path(settings.vertexJobSpec),
    )


def _secret_access(settings: StackSettings, project: str | None) -> tuple[tuple[str, str], ...]:
    """The Secret Manager secrets a Vertex stack's jobs, or a GCE stack's reconcile job, read
    themselves (the program grants its account access to each); a bad entry is a SpecError like
    any other setting's."""
    try:
        return secret_grants(parse_secrets(settings.secrets, NS + "secrets"), project)
    except UserError as e:
        raise SpecError(str(e)) from None


@dataclass(frozen=True)
class MissingSetting:
    """A setting `pulumi up` needs that the stack does not have yet, and how to set it."""

    key: str
    why: str
    command: str


def missing_settings(spec: ClusterSpec) -> list[MissingSetting]:
    """What must still be set before `pulumi up`, in the order to set it."""
    s = spec.stack
    out = []
    if spec.project is None:
        out.append(
            MissingSetting(
                GCP_PROJECT_KEY,
                "the GCP project the Vertex AI jobs run in"
                if spec.on_vertex
                else "the GCP project to create the VMs in",
                f"pulumi config set gcp:project YOUR_PROJECT_ID --stack {s}",
            )
        )
    if spec.on_vertex:  # no machines of ours to log in to
        return out
    if spec.ssh_public_key is None:
        out.append(
            MissingSetting(
                NS + "sshPublicKey",
                "the SSH key pair for the nodes (the private half is stored as a secret)",
                f"gputrain keygen --stack {s}",
            )
        )
    if not spec.ssh_source_ranges:
        out.append(
            MissingSetting(
                NS + "sshSourceRanges",
                "where SSH may come from (your address/32)",
                f"pulumi config set --path 'gputrain:sshSourceRanges[0]' YOUR.IP.ADD.RESS/32 --stack {s}",
            )
        )
    return out


def settings_from_config(config: Mapping[str, str], given: Collection[str] = ()) -> StackSettings:
    """The typed settings of a Pulumi config (strings all the way), or the one-line SpecError
    naming the first key whose value its kind does not take."""
    try:
        return load_config_strings(config, NS, given)
    except SettingTypeError as e:
        raise SpecError(e.line or f"{NS}{e.key} = {e.value!r}: allowed: {e.allowed}") from None


def require_deployable(spec: ClusterSpec) -> None:
    """Refuse, with one line, a spec that `plan` accepts but `pulumi up` cannot deploy."""
    missing = missing_settings(spec)
    if missing:
        m = missing[0]
        raise SpecError(f"{m.key} is not set ({m.why}); run: {m.command}")


def billing_export(text: str) -> str | None:
    """billingExport: PROJECT.DATASET.TABLE, or None when unset."""
    return parse_table(text, f"{NS}billingExport") if text else None


def stack_bucket_name(stack: str, project: str) -> str:
    """The name of a stack's own bucket: `gputrain-<stack>-<project>` (unique: project IDs are),
    or with a hash of the project where that breaks a naming rule (length, 'google'). Pure."""
    import hashlib

    name = f"gputrain-{stack}-{project}"
    if keys.bucket_name_problem(name):
        name = f"gputrain-{stack}-{hashlib.sha256(project.encode()).hexdigest()[:12]}"
    return name
