"""HAMi's GPU pair scores (`hami.io/node-nvidia-score`) from the links between a node's GPUs.

Pure apart from `read_pair_scores`, which asks a backend for the links. The rules are HAMi v2.10's
device plugin (pkg/device/nvidia/calculate_score.go and links.go; facts, not code):

- For every ordered pair of GPUs (a, b), a has a list of "P2P links" to b: one entry for the PCIe
  common ancestor when NVML names one, and one for NVLink when a has 1 to 18 NVLinks reaching b.
- The pair's score from a to b is the sum over a's entries: across NUMA nodes (SYSTEM) 10, same NUMA
  node 20, same host bridge 30, several PCIe switches 40, one PCIe switch 50, same board 60, and N
  NVLinks 100 x N. So two GPUs on one NUMA node with 4 NVLinks score 20 + 400 = 420.
- When a lists a different number of entries to b than b to a (an NVLink enabled on one side only),
  the pair is asymmetric: it scores 0 both ways, and the device plugin logs it and raises a Warning
  Event `AsymmetricGPUP2PLink` on the Node.
- The NVLink count (HAMi's GetNVLink), from each GPU's NVLink ports (`NvLinkPorts`): the number of a's
  enabled links whose remote PCI device is b; when there is none but a has enabled links, the NVSwitch
  case: when both GPUs have links to an NVSwitch, the smaller of their two switch link counts. A count
  above 18 is no NVLink at all (HAMi's link types stop at 18).

The annotation lists every GPU with a score for each other one (`GPUPairScore`); hami_control's
topology-aware policy picks the set of GPUs with the highest summed score.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hami_api.types import GPUPairScore
from hami_node.gpu.backend import GPUBackend, GPULink, TopologyLevel

LEVEL_SCORES: Mapping[TopologyLevel, int] = {
    TopologyLevel.SYSTEM: 10,
    TopologyLevel.NUMA_NODE: 20,
    TopologyLevel.HOST_BRIDGE: 30,
    TopologyLevel.MULTI_SWITCH: 40,
    TopologyLevel.SINGLE_SWITCH: 50,
    TopologyLevel.SAME_BOARD: 60,
}
"""HAMi's score of each PCIe level (P2PLinkCrossCPU 10 .. P2PLinkSameBoard 60)."""

NVLINK_SCORE = 100
"""HAMi's score per NVLink (SingleNVLINKLink 100 .. EighteenNVLINKLinks 1800)."""

MAX_NVLINKS = 18
"""The most NVLinks HAMi has a link type for; a larger count is no NVLink entry at all."""

NO_LINK = GPULink(None, 0)


@dataclass(frozen=True, slots=True)
class AsymmetricPair:
    """A pair of GPUs whose two directions list a different number of link entries."""

    gpu_a: str
    gpu_b: str
    entries_ab: int
    entries_ba: int

    def __str__(self) -> str:
        return (
            f"{self.gpu_a} <-> {self.gpu_b}: {self.entries_ab} link(s) from {self.gpu_a} to {self.gpu_b}, "
            f"{self.entries_ba} link(s) from {self.gpu_b} to {self.gpu_a}"
        )


@dataclass(frozen=True, slots=True)
class TopologyScores:
    """The annotation's entries (one per GPU, in the order given) and the asymmetric pairs (each once,
    in the order of their first GPU), which scored 0."""

    scores: tuple[GPUPairScore, ...]
    asymmetric: tuple[AsymmetricPair, ...] = ()


def nvlink_entry_score(count: int) -> int:
    """The score of a's NVLink entry to b for `count` NVLinks: 100 x count for 1..18, else 0 (no entry)."""
    return NVLINK_SCORE * count if 1 <= count <= MAX_NVLINKS else 0


def link_entries(link: GPULink) -> int:
    """How many P2P link entries HAMi lists for this direction: the PCIe level (when known) and NVLink
    (when 1..18 links)."""
    return (link.level is not None) + (1 <= link.nvlinks <= MAX_NVLINKS)


def link_score(link: GPULink) -> int:
    """The sum over this direction's entries."""
    level = 0 if link.level is None else LEVEL_SCORES[link.level]
    return level + nvlink_entry_score(link.nvlinks)


def pair_score(ab: GPULink, ba: GPULink) -> tuple[int, bool]:
    """(score from a to b, asymmetric): HAMi's calculateGPUPairScore for a's link `ab` and b's `ba`."""
    if link_entries(ab) != link_entries(ba):
        return 0, True
    return link_score(ab), False


def gpu_pair_scores(uuids: Sequence[str], links: Mapping[tuple[str, str], GPULink]) -> TopologyScores:
    """HAMi's calculateGPUScore: for each GPU, its score to every other one. `links[(a, b)]` is the link
    as a sees it; a missing direction counts as no link at all."""
    scores: list[GPUPairScore] = []
    asymmetric: list[AsymmetricPair] = []
    for i, a in enumerate(uuids):
        row: dict[str, int] = {}
        for j, b in enumerate(uuids):
            if i == j:
                continue
            ab, ba = links.get((a, b), NO_LINK), links.get((b, a), NO_LINK)
            row[b], odd = pair_score(ab, ba)
            if odd and i < j:
                asymmetric.append(AsymmetricPair(a, b, link_entries(ab), link_entries(ba)))
        scores.append(GPUPairScore.of(a, row))
    return TopologyScores(tuple(scores), tuple(asymmetric))


def read_pair_scores(backend: GPUBackend, uuids: Sequence[str]) -> TopologyScores:
    """The scores of these GPUs from the backend's links. Raises what `GPUBackend.links` raises."""
    return gpu_pair_scores(uuids, backend.links(uuids))


# --- the NVLink count between two GPUs (HAMi's GetNVLink) -------------------------------------------


@dataclass(frozen=True, slots=True)
class NvLinkPorts:
    """One GPU's enabled NVLinks as NVML reports them: the remote PCI bus id of each link NVML can tell
    it for, and how many links reach an NVSwitch."""

    remote_bus_ids: tuple[str, ...] = ()
    switch_links: int = 0


def bus_id_key(bus_id: str) -> str:
    """A PCI bus id in the form HAMi compares (PciInfo.BusID): lower case, the domain in 4 digits
    ("00000000:2A:00.0" -> "0000:2a:00.0"). NVML writes the domain in 8 digits, where HAMi cuts a
    leading "0000"; a 4-digit domain is read as the same device here too."""
    key = bus_id.strip().lower()
    domain, sep, rest = key.partition(":")
    if not sep or not domain or any(c not in "0123456789abcdef" for c in domain):
        return key
    return f"{int(domain, 16):04x}:{rest}"


def count_matching_links(remote_bus_ids: Sequence[str], bus_id: str) -> int:
    """How many of the remote bus ids are the device `bus_id`."""
    wanted = bus_id_key(bus_id)
    return sum(1 for remote in remote_bus_ids if bus_id_key(remote) == wanted)


def nvlink_count(own: NvLinkPorts, peer_bus_id: str, peer: NvLinkPorts) -> int:
    """The NVLinks from a GPU with ports `own` to the GPU at `peer_bus_id` with ports `peer`: direct
    links first, else through NVSwitches (both GPUs on a switch: the smaller switch link count).
    0 for none, and for a count HAMi has no link type for (above 18)."""
    direct = count_matching_links(own.remote_bus_ids, peer_bus_id)
    if 1 <= direct <= MAX_NVLINKS:
        return direct
    if not own.remote_bus_ids:
        return 0
    if own.switch_links > 0 and peer.switch_links > 0:
        count = min(own.switch_links, peer.switch_links)
        return count if count <= MAX_NVLINKS else 0
    return 0


__all__ = [
    "LEVEL_SCORES",
    "MAX_NVLINKS",
    "NO_LINK",
    "NVLINK_SCORE",
    "AsymmetricPair",
    "NvLinkPorts",
    "TopologyScores",
    "bus_id_key",
    "count_matching_links",
    "gpu_pair_scores",
    "link_entries",
    "link_score",
    "nvlink_count",
    "nvlink_entry_score",
    "pair_score",
    "read_pair_scores",
]
