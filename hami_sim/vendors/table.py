"""One table per vendor: what a vendor's device plugin is only by name (the resources it registers, the
Node and Pod annotations it reads and writes, the env keys it answers Allocate with) and the products a
fake node may hold, with their defaults. Pure data and validation; what differs in behaviour is code in
`hami_sim.vendors.inventory` (what goes on the Node) and `hami_sim.vendors.allocate` (Allocate).

Each table cites the plugin source it follows (`source`); where no public HAMi-mode plugin source was
found the table says so and follows HAMi's scheduler side (pkg/device/<vendor>/device.go, v2.10: the
annotations it writes for the plugin) instead, and its env key is the vendor runtime's visible-devices
variable, an assumption named as such in docs/vendor-nodes.md.

Flows (`Flow`), i.e. how a plugin finds the pod and the container it allocates:
- `HAMI`: HAMi's device-plugin protocol (HAMi pkg/util GetPendingPod, pkg/device-plugin/nvidiadevice/
  nvinternal/plugin/util.go PodAllocationTrySuccess): the pod bound here with `hami.io/bind-phase`
  allocating (or success) whose `to_allocate` annotation still names devices; each Allocate takes the
  first container with devices, blanks it in `to_allocate`, and `hami.io/bind-phase: success` is written
  once nothing is left (failed on an error);
- `DSMLU`: Cambricon's dynamic-smlu (cambricon-k8s-device-plugin device-plugin/pkg/mlu/server.go
  allocateDynamicSmlu): the one Pending pod with `CAMBRICON_DSMLU_ASSIGNED: "false"`;
- `ALLOCATED`: the vendors HAMi writes no to-allocate annotation for (Mthreads, Enflame DRS, Kunlun XPU,
  AWS Neuron): the containers are taken in order from `allocated`, the plugin's own marker annotation
  (`marker`) flips to "true" once every container is done (Enflame DRS: as gcushare does, by its
  `assigned-containers` record; see hami_sim.vendors.allocate).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

NVIDIA = "nvidia"
"""The vendor of a node without other accelerators (hami-node's fake GPUs)."""


class SpecError(ValueError):
    """A bad fake device list; the message names the field and the value."""


class Units(StrEnum):
    """How many devices of a resource ListAndWatch advertises per physical device."""

    SPLIT = "split"
    """`split` virtual devices (the plugin's share count)."""
    WHOLE = "whole"
    """One."""
    PERCENT = "percent"
    """100 (Cambricon's vcore: percent of a card)."""
    CORES = "cores"
    """`cores` (Mthreads' sgpu-core, AWS Neuron's NeuronCores)."""
    MEMORY_256 = "memory/256"
    """The memory in 256 MiB units (Cambricon's vmemory with --min-dsmlu-unit=256)."""
    MEMORY_512 = "memory/512"
    """The memory in 512 MiB units (Mthreads' sgpu-memory)."""


@dataclass(frozen=True)
class Resource:
    """One resource the plugin registers with the kubelet. `name` may hold `{cw}` (the chip's common
    word); Allocate on a resource that is not `primary` answers an empty container response."""

    name: str
    units: Units
    primary: bool = True


class Flow(StrEnum):
    HAMI = "hami"
    DSMLU = "dsmlu"
    ALLOCATED = "allocated"


class Register(StrEnum):
    """The form of the node inventory the plugin writes."""

    NONE = "none"
    """None: HAMi reads the node's capacity."""
    LEGACY = "legacy"
    """`id,count,devmem,devcore,type,numa,health,index,mode:` per device."""
    JSON = "json"
    """Go's json.Marshal of HAMi's `[]DeviceInfo`."""
    METAX_SGPU = "metax-sgpu"
    """MetaX's own JSON list (`metax-tech.com/node-gpu-devices`)."""
    ENFLAME_DRS = "enflame-drs"
    """Enflame's DRS capacity JSON (`enflame.com/gcu-drs-capacity`)."""


class Handshake(StrEnum):
    NONE = "none"
    GO_TIME = "go-time"
    """`Reported <Go's time.Now().String()>` (dcu-vgpu-device-plugin)."""
    ASCEND = "ascend"
    """`Reported_<2006.01.02 15:04:05>`, one second ahead (ascend-device-plugin --report_time_offset 1)."""
    DOTTED = "dotted"
    """`Reported_<date and time>` (biren-device-plugin register.go; its Go layout "2026.01.02 15:04:05"
    is a typo of 2006's, written here as the date it means)."""


@dataclass(frozen=True)
class Product:
    """A product a fake node may hold: its model name and defaults (memory MiB, cores, share count)."""

    model: str
    memory_mib: int
    cores: int = 100
    split: int = 1
    word: str = ""
    """The common word of a per-chip vendor (Ascend, Iluvatar); "" for the others."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """What else the product brings (Enflame's DRS profiles, Ascend's templates, ...)."""


@dataclass(frozen=True)
class VendorTable:
    vendor: str
    mode: str
    """The plugin mode ("" for vendors with one)."""
    source: str
    """The plugin source this follows, or why none."""
    common_word: str
    """HAMi's common word ("{cw}": the chip's, per product)."""
    resources: tuple[Resource, ...]
    flow: Flow
    products: tuple[Product, ...]
    """The first is the default."""
    register: str = ""
    register_form: Register = Register.NONE
    handshake: str = ""
    handshake_form: Handshake = Handshake.NONE
    to_allocate: str = ""
    allocated: str = ""
    marker: str = ""
    """The annotation the plugin flips from "false" to "true" when done (`Flow.ALLOCATED`, `DSMLU`)."""
    lock: str = ""
    """The node lock annotation the plugin releases ("" none)."""
    visible_env: str = ""
    """The env key listing a container's devices ("" none)."""
    socket: str = ""
    """The plugin socket's file name in the kubelet directory, before `-<resource suffix>.sock`."""

    @property
    def key(self) -> str:
        return f"{self.vendor}/{self.mode}" if self.mode else self.vendor

    def product(self, model: str) -> Product | None:
        wanted = _model_key(self.vendor, model)
        return next((p for p in self.products if _model_key(self.vendor, p.model) == wanted), None)


def _model_key(vendor: str, model: str) -> str:
    key = model.strip().lower()
    return key.removeprefix("ascend") if vendor == "ascend" else key


MUTEX_LOCK = "hami.io/mutex.lock"
DSMLU_LOCK = "cambricon.com/dsmlu.lock"

# --- the tables ----------------------------------------------------------------------------------------

_ASCEND_CHIPS = (
    # (model, common word, memoryAllocatable, aiCore, smallest template memory, templates)
    # HAMi's device config (hami_control/devices/device-config.yaml, vnpus.configs, v2.10's chart).
    ("910B4", "Ascend910B4", 32768, 20, (("vir05_1c_8g", 8192), ("vir10_3c_16g", 16384))),
    ("910A", "Ascend910A", 32768, 30, (("vir02", 2184), ("vir04", 4369), ("vir08", 8738), ("vir16", 17476))),
    ("910B2", "Ascend910B2", 65536, 24,
     (("vir03_1c_8g", 8192), ("vir06_1c_16g", 16384), ("vir12_3c_32g", 32768))),
    ("910B3", "Ascend910B3", 65536, 20, (("vir05_1c_16g", 16384), ("vir10_3c_32g", 32768))),
    ("910B4-1", "Ascend910B4-1", 65536, 20, (("vir05_1c_16g", 16384), ("vir10_3c_32g", 32768))),
    ("310P", "Ascend310P", 21527, 8, (("vir01", 3072), ("vir02", 6144), ("vir04", 12288))),
    ("910C", "Ascend910C", 65536, 20, (("vir05_1c_16g", 16384), ("vir10_3c_32g", 32768))),
)  # fmt: skip

ASCEND = VendorTable(
    vendor="ascend",
    mode="",
    source="Project-HAMi/ascend-device-plugin internal/server/{register.go,server.go,allocate.go}, "
    "internal/manager/manager.go",
    common_word="{cw}",
    resources=(Resource("huawei.com/{cw}", Units.SPLIT),),
    flow=Flow.HAMI,
    products=tuple(
        # VDeviceCount: memoryAllocatable / the smallest template's memory
        Product(model, memory, cores, memory // templates[0][1], word, {"templates": templates})
        for model, word, memory, cores, templates in _ASCEND_CHIPS
    ),
    register="hami.io/node-register-{cw}",
    register_form=Register.JSON,
    handshake="hami.io/node-handshake-{cw}",
    handshake_form=Handshake.ASCEND,
    to_allocate="hami.io/{cw}-devices-to-allocate",
    allocated="huawei.com/{cw}",
    lock=MUTEX_LOCK,
    visible_env="ASCEND_VISIBLE_DEVICES",
    socket="{cw}",
)

HYGON = VendorTable(
    vendor="hygon",
    mode="",
    source="Project-HAMi/dcu-vgpu-device-plugin internal/pkg/dcu/{register.go,server.go}, "
    "internal/pkg/util/util.go",
    common_word="DCU",
    resources=(Resource("hygon.com/dcunum", Units.SPLIT),),
    flow=Flow.HAMI,
    # register.go hard-codes Count 4; the type is "DCU-" + the DTK device type name.
    products=(
        Product("Z100L", 32768, 100, 4),
        Product("Z100", 16384, 100, 4),
        Product("K100", 65536, 100, 4),
    ),
    register="hami.io/node-dcu-register",
    register_form=Register.LEGACY,
    handshake="hami.io/node-handshake-dcu",
    handshake_form=Handshake.GO_TIME,
    to_allocate="hami.io/dcu-devices-to-allocate",
    allocated="hami.io/dcu-devices-allocated",
    lock=MUTEX_LOCK,
    socket="hygon",
)

CAMBRICON = VendorTable(
    vendor="cambricon",
    mode="",
    source="Cambricon/cambricon-k8s-device-plugin v2.0.23 device-plugin/pkg/mlu/{server.go,cambricon.go,"
    "podutils.go,const.go} in --mode=dynamic-smlu --min-dsmlu-unit=256",
    common_word="MLU",
    resources=(
        Resource("cambricon.com/real-mlu-counts", Units.WHOLE, primary=False),
        Resource("cambricon.com/mlu.smlu.vcore", Units.PERCENT),
        Resource("cambricon.com/mlu.smlu.vmemory", Units.MEMORY_256),
    ),
    flow=Flow.DSMLU,
    products=(Product("MLU370-X4", 24576), Product("MLU370-X8", 49152), Product("MLU590", 81920)),
    to_allocate="hami.io/cambricon-mlu-devices-to-allocate",
    allocated="hami.io/cambricon-mlu-devices-allocated",
    marker="CAMBRICON_DSMLU_ASSIGNED",
    lock=DSMLU_LOCK,
    socket="cambricon",
)

ILUVATAR = VendorTable(
    vendor="iluvatar",
    mode="",
    source="none public in HAMi mode (Deep-Spark/ix-device-plugin has no HAMi registration): HAMi's side, "
    "pkg/device/iluvatar/device.go; the env key IX_VISIBLE_DEVICES is ix-device-plugin's (pkg/dpm/plugin.go)",
    common_word="{cw}",
    resources=(Resource("iluvatar.ai/{cw}-vgpu", Units.SPLIT),),
    flow=Flow.HAMI,
    products=(
        Product("MR-V100", 32768, 100, 10, "MR-V100"),
        Product("MR-V50", 16384, 100, 10, "MR-V50"),
        Product("BI-V150", 65536, 100, 10, "BI-V150"),
        Product("BI-V100", 32768, 100, 10, "BI-V100"),
    ),
    register="hami.io/node-{cw}-register",
    register_form=Register.LEGACY,
    handshake="hami.io/node-handshake-{cw}",
    handshake_form=Handshake.GO_TIME,
    to_allocate="hami.io/{cw}-devices-to-allocate",
    allocated="hami.io/{cw}-devices-allocated",
    lock=MUTEX_LOCK,
    visible_env="IX_VISIBLE_DEVICES",
    socket="iluvatar-{cw}",
)

METAX_SGPU = VendorTable(
    vendor="metax",
    mode="sgpu",
    source="none public: HAMi's side, pkg/device/metax/{sdevice.go,protocol.go}",
    common_word="Metax-SGPU",
    resources=(Resource("metax-tech.com/sgpu", Units.SPLIT),),
    flow=Flow.HAMI,
    products=(Product("MXC500", 65536, 100, 16), Product("MXC550", 65536, 100, 16)),
    register="metax-tech.com/node-gpu-devices",
    register_form=Register.METAX_SGPU,
    to_allocate="hami.io/metax-sgpu-devices-to-allocate",
    allocated="hami.io/metax-sgpu-devices-allocated",
    lock=MUTEX_LOCK,
    visible_env="METAX_VISIBLE_DEVICES",
    socket="metax-sgpu",
)

METAX_GPU = VendorTable(
    vendor="metax",
    mode="gpu",
    source="none public: HAMi's side, pkg/device/metax/device.go (inventory from capacity)",
    common_word="Metax-GPU",
    resources=(Resource("metax-tech.com/gpu", Units.WHOLE),),
    flow=Flow.HAMI,
    products=(Product("MXC500", 65536), Product("MXC550", 65536)),
    to_allocate="hami.io/metax-gpu-devices-to-allocate",
    allocated="hami.io/metax-gpu-devices-allocated",
    visible_env="METAX_VISIBLE_DEVICES",
    socket="metax-gpu",
)

MTHREADS = VendorTable(
    vendor="mthreads",
    mode="",
    source="none public: HAMi's side, pkg/device/mthreads/device.go (inventory from capacity, "
    "mthreads.com/gpu-index for the plugin)",
    common_word="Mthreads",
    resources=(
        Resource("mthreads.com/vgpu", Units.SPLIT),
        Resource("mthreads.com/sgpu-core", Units.CORES, primary=False),
        Resource("mthreads.com/sgpu-memory", Units.MEMORY_512, primary=False),
    ),
    flow=Flow.ALLOCATED,
    # A GPU is 16 sgpu cores and memory / 512 MiB units (HAMi: 16 cores, 96 units on an S4000).
    products=(Product("MTT S4000", 49152, 16, 16), Product("MTT S3000", 32768, 16, 16)),
    allocated="hami.io/mthreads-vgpu-devices-allocated",
    visible_env="MTHREADS_VISIBLE_DEVICES",
    socket="mthreads",
)

ENFLAME_DRS = VendorTable(
    vendor="enflame",
    mode="drs",
    source="EnflameTechnology/gcushare gcushare-device-plugin/pkg/server/server.go (Allocate, "
    "makeContainerResponse), pkg/resource/pod.go (PodExistContainerCanBind), pkg/consts/const.go; "
    "HAMi's side pkg/device/enflame/device.go for the inventory",
    common_word="Enflame",
    resources=(Resource("enflame.com/drs-gcu", Units.SPLIT),),
    flow=Flow.ALLOCATED,
    products=(
        Product(
            "S60",
            49152,
            100,
            6,
            extra={"profiles": {"1g.6gb": "0", "2g.12gb": "1", "3g.24gb": "2", "6g.48gb": "3"}},
        ),
    ),
    register="enflame.com/gcu-drs-capacity",
    register_form=Register.ENFLAME_DRS,
    allocated="hami.io/enflame-vgpu-devices-allocated",
    marker="enflame.com/gcu-assigned",
    visible_env="ENFLAME_VISIBLE_DEVICES",
    socket="enflame-drs",
)

ENFLAME_GCU = VendorTable(
    vendor="enflame",
    mode="gcu",
    source="none public: HAMi's side, pkg/device/enflame/gcu.go (inventory from capacity)",
    common_word="GCU",
    resources=(Resource("enflame.com/gcu", Units.WHOLE),),
    flow=Flow.HAMI,
    products=(Product("S60", 49152),),
    to_allocate="hami.io/enflame-gcu-devices-to-allocate",
    allocated="hami.io/enflame-gcu-devices-allocated",
    visible_env="ENFLAME_VISIBLE_DEVICES",
    socket="enflame-gcu",
)

KUNLUN_VXPU = VendorTable(
    vendor="kunlun",
    mode="vxpu",
    source="none public: HAMi's side, pkg/device/kunlun/vdevice.go",
    common_word="XPU",
    resources=(Resource("kunlunxin.com/vxpu", Units.SPLIT),),
    flow=Flow.HAMI,
    # vXPU sizes are 24576, 49152 and 98304 MiB of a 98304 MiB XPU: at most 4 on one.
    products=(Product("P800", 98304, 100, 4),),
    register="hami.io/node-register-xpu",
    register_form=Register.JSON,
    handshake="hami.io/node-handshake-xpu",
    handshake_form=Handshake.GO_TIME,
    to_allocate="hami.io/xpu-devices-to-allocate",
    allocated="hami.io/xpu-devices-allocated",
    lock=MUTEX_LOCK,
    visible_env="XPU_VISIBLE_DEVICES",
    socket="kunlun-vxpu",
)

KUNLUN_XPU = VendorTable(
    vendor="kunlun",
    mode="xpu",
    source="none public: HAMi's side, pkg/device/kunlun/device.go (inventory from capacity, "
    "BAIDU_COM_DEVICE_IDX for the plugin)",
    common_word="kunlun",
    resources=(Resource("kunlunxin.com/xpu", Units.WHOLE),),
    flow=Flow.ALLOCATED,
    products=(Product("P800", 98304),),
    allocated="hami.io/kunlun-allocated",
    visible_env="XPU_VISIBLE_DEVICES",
    socket="kunlun-xpu",
)

AWS_NEURON = VendorTable(
    vendor="awsneuron",
    mode="",
    source="none public (AWS ships the plugin as an image): HAMi's side, pkg/device/awsneuron/device.go "
    "(AWS_NEURON_IDS and NEURON_ALLOCATED for the plugin); the answer as AWS documents it, "
    "aws-neuron/aws-neuron-sdk deploy/infrastructure/scheduler-flow.rst",
    common_word="AWSNeuron",
    resources=(
        Resource("aws.amazon.com/neuron", Units.WHOLE),
        Resource("aws.amazon.com/neuroncore", Units.CORES),
    ),
    flow=Flow.ALLOCATED,
    # The model is the instance type (the node label HAMi reads); cores are NeuronCores per device.
    products=(
        Product("inf2.xlarge", 32768, 2),
        Product("inf2.8xlarge", 32768, 2),
        Product("trn1.2xlarge", 32768, 2),
        Product("trn1.32xlarge", 32768, 2),
    ),
    allocated="hami.io/aws-neuron-devices-allocated",
    marker="NEURON_ALLOCATED",
    visible_env="AWS_NEURON_VISIBLE_DEVICES",
    socket="neuron",
)

AMD = VendorTable(
    vendor="amd",
    mode="",
    source="Project-HAMi/amd-device-plugin internal/pkg/plugin/plugin.go, internal/pkg/utils/utils.go",
    common_word="AMD",
    resources=(Resource("amd.com/gpu", Units.SPLIT),),
    flow=Flow.HAMI,
    # Devcore is the compute-unit count (AMD SMI); defaultSplitCount = 10.
    products=(
        Product("AMD Instinct MI300X", 196608, 304, 10),
        Product("AMD Instinct MI250X", 131072, 220, 10),
        Product("AMD Instinct MI210", 65536, 104, 10),
    ),
    register="hami.io/node-amd-register",
    register_form=Register.JSON,
    to_allocate="hami.io/amd-devices-to-allocate",
    allocated="hami.io/amd-devices-allocated",
    lock=MUTEX_LOCK,
    visible_env="ROCR_VISIBLE_DEVICES",
    socket="amd",
)

VASTAI = VendorTable(
    vendor="vastai",
    mode="",
    source="none public: HAMi's side, pkg/device/vastai/device.go",
    common_word="Vastai",
    resources=(Resource("vastaitech.com/va", Units.SPLIT),),
    flow=Flow.HAMI,
    products=(Product("VA16", 16384), Product("VA1L", 32768)),
    register="hami.io/node-va-register",
    register_form=Register.JSON,
    handshake="hami.io/node-handshake-va",
    handshake_form=Handshake.GO_TIME,
    to_allocate="hami.io/Vastai-devices-to-allocate",
    allocated="hami.io/Vastai-devices-allocated",
    lock=MUTEX_LOCK,
    visible_env="VASTAI_VISIBLE_DEVICES",
    socket="vastai",
)

BIREN = VendorTable(
    vendor="biren",
    mode="",
    source="Project-HAMi/biren-device-plugin pkg/brgpu/{register.go,plugin.go}, pkg/utils/util.go (runc)",
    common_word="Biren",
    resources=(Resource("birentech.com/gpu", Units.SPLIT),),
    flow=Flow.HAMI,
    products=(Product("BR104", 32768), Product("BR100", 65536)),
    register="hami.io/node-biren-register",
    register_form=Register.JSON,
    handshake="hami.io/node-handshake-biren",
    handshake_form=Handshake.DOTTED,
    to_allocate="hami.io/Biren-devices-to-allocate",
    allocated="hami.io/Biren-devices-allocated",
    lock=MUTEX_LOCK,
    visible_env="BR_PHY_CARDS",
    socket="biren",
)

TABLES: Mapping[str, VendorTable] = {
    t.key: t
    for t in (
        HYGON,
        ASCEND,
        CAMBRICON,
        ILUVATAR,
        METAX_SGPU,
        METAX_GPU,
        MTHREADS,
        ENFLAME_DRS,
        ENFLAME_GCU,
        KUNLUN_VXPU,
        KUNLUN_XPU,
        AWS_NEURON,
        AMD,
        VASTAI,
        BIREN,
    )
}
"""Every table by `<vendor>` or `<vendor>/<mode>`."""

DEFAULT_MODES: Mapping[str, str] = {"metax": "sgpu", "enflame": "drs", "kunlun": "vxpu"}
"""The mode of a vendor whose plugin has several when the node names none: HAMi's sharing one."""

VENDORS: tuple[str, ...] = tuple(dict.fromkeys(t.vendor for t in TABLES.values()))
"""Every vendor name a node may give besides `nvidia`."""

GATES: Mapping[str, str] = {"ascend": "--enable-ascend", "iluvatar": "--enable-iluvatar"}
"""hami-control flags without which HAMi (and hami-control) leave a vendor out."""


def table_for(vendor: str, mode: str = "") -> VendorTable:
    """The table of `vendor` in `mode` (its default mode when ""); `SpecError` naming the field."""
    if vendor not in VENDORS:
        raise SpecError(f"vendor: expected {NVIDIA} or one of {', '.join(VENDORS)}, got {vendor!r}")
    modes = sorted(t.mode for t in TABLES.values() if t.vendor == vendor)
    chosen = mode or DEFAULT_MODES.get(vendor, "")
    found = TABLES.get(f"{vendor}/{chosen}" if chosen else vendor)
    if found is None:
        if modes == [""]:
            raise SpecError(f"mode: the {vendor} plugin has no modes, got {mode!r}")
        raise SpecError(f"mode: expected one of {', '.join(modes)} for {vendor}, got {mode!r}")
    return found


# --- the fake devices of a node ------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceSpec:
    """The fake devices of one vendor on a node: `count` devices of `model`, each `memory_mib` MiB and
    `cores` cores (the vendor's unit), shared `split` ways."""

    vendor: str
    model: str
    count: int
    memory_mib: int
    cores: int
    split: int
    mode: str = ""

    @property
    def table(self) -> VendorTable:
        return table_for(self.vendor, self.mode)

    @property
    def product(self) -> Product:
        product = self.table.product(self.model)
        return (
            product if product is not None else Product(self.model, self.memory_mib, self.cores, self.split)
        )

    @property
    def common_word(self) -> str:
        return self.table.common_word.replace("{cw}", self.product.word or self.model)

    def name(self, template: str) -> str:
        """A table name with the chip's common word filled in."""
        return template.replace("{cw}", self.common_word)

    @property
    def resources(self) -> tuple[str, ...]:
        return tuple(self.name(r.name) for r in self.table.resources)

    @property
    def count_resource(self) -> str:
        """The resource whose allocatable says the plugin is registered (the table's first primary)."""
        return next(self.name(r.name) for r in self.table.resources if r.primary)

    def to_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "vendor": self.vendor,
            "model": self.model,
            "count": self.count,
            "memory": self.memory_mib,
            "cores": self.cores,
            "split": self.split,
        }
        if self.mode:
            data["mode"] = self.mode
        return data


DEVICE_KEYS = ("vendor", "mode", "model", "count", "memory", "cores", "split")


def _positive(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{key}: expected an integer >= 1, got {value!r}")
    return value


def device_spec(data: Mapping[str, Any]) -> DeviceSpec:
    """A `DeviceSpec` from `{vendor, mode?, model?, count?, memory?, cores?, split?}`: what is left out
    is the product's default (the vendor's first product when no model is given; count 1). A model the
    table does not know needs `memory`. `SpecError` names the key and the value."""
    unknown = sorted(set(data) - set(DEVICE_KEYS))
    if unknown:
        raise SpecError(f"unknown key {unknown[0]!r} (expected {', '.join(DEVICE_KEYS)})")
    vendor, mode = data.get("vendor"), data.get("mode", "")
    if not isinstance(vendor, str):
        raise SpecError(f"vendor: expected a vendor name, got {vendor!r}")
    if not isinstance(mode, str):
        raise SpecError(f"mode: expected a plugin mode, got {mode!r}")
    table = table_for(vendor, mode)
    model = data.get("model", table.products[0].model)
    if not isinstance(model, str) or not model.strip():
        raise SpecError(f"model: expected a model name, got {model!r}")
    product = table.product(model)
    if product is None and "memory" not in data:
        known = ", ".join(p.model for p in table.products)
        raise SpecError(f"model: {model!r} is not a known {vendor} product ({known}); give its memory in MiB")
    if product is None and table.common_word == "{cw}":
        known = ", ".join(p.model for p in table.products)
        raise SpecError(f"model: {vendor} needs one of its chips ({known}), got {model!r}")
    base = product or Product(model, 0)
    count = _positive(data.get("count", 1), "count")
    memory = _positive(data.get("memory", base.memory_mib), "memory")
    cores = _positive(data.get("cores", base.cores), "cores")
    split = _positive(data.get("split", base.split), "split")
    if count > 64:
        raise SpecError(f"count: at most 64 devices on one node, got {count}")
    return DeviceSpec(vendor, product.model if product else model, count, memory, cores, split, table.mode)


__all__ = [
    "DEFAULT_MODES",
    "DEVICE_KEYS",
    "GATES",
    "NVIDIA",
    "TABLES",
    "VENDORS",
    "DeviceSpec",
    "Flow",
    "Handshake",
    "Product",
    "Register",
    "Resource",
    "SpecError",
    "Units",
    "VendorTable",
    "device_spec",
    "table_for",
]
