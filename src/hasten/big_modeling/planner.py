"""The greedy device-map planner behind `infer_auto_device_map`, in time linear in the modules.

Items (whole modules, or single tensors once their module is split) are taken in module order
and put on the first device with room, accelerators first, then cpu, then disk. On the main
devices (first accelerator and cpu) room is kept for the largest layer still to place, so an
offloaded layer can always be brought back. That "largest remaining layer" is a suffix maximum
over the layers in pre-order, so each step costs O(1) instead of a rescan of the model.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field

from hasten.big_modeling.sizes import ModuleTree

__all__ = ["DeviceKey", "Plan", "Planner"]

DeviceKey = int | str
# A tensor item: (owning module node, local name, bytes, is_buffer).
_Tensor = tuple[int, str, "int | float", bool]
_Item = int | _Tensor


@dataclass
class Plan:
    """What the planner decided: entries in placement order, plus bookkeeping for warnings."""

    entries: list[tuple[_Item, DeviceKey]] = field(default_factory=list)
    used: dict[DeviceKey, int | float] = field(default_factory=dict)
    offloaded_buffers: int | float = 0
    too_small: dict[DeviceKey, int | float] = field(default_factory=dict)


class Planner:
    """One planning run over a `ModuleTree` with a fixed device budget."""

    def __init__(
        self,
        tree: ModuleTree,
        max_memory: Mapping[DeviceKey, int | float],
        *,
        verbose: bool = False,
        offload_buffers: bool = False,
        fallback_allocation: bool = False,
    ) -> None:
        self.tree = tree
        self.max_memory = dict(max_memory)
        self.devices: list[DeviceKey] = list(max_memory)
        if "disk" not in self.devices:
            self.devices.append("disk")
        accelerators = [d for d in self.devices if d not in ("cpu", "disk")]
        self.main: set[DeviceKey]
        if "mps" in accelerators:
            self.main = {"mps"}
        elif accelerators:
            self.main = {accelerators[0], "cpu"}
        else:
            self.main = {"cpu"}
        self.verbose = verbose
        self.offload_buffers = offload_buffers
        self.fallback_allocation = fallback_allocation
        self._init_layers()
        self._init_ties()

    # ---- largest remaining layer -------------------------------------------------------------
    def _init_layers(self) -> None:
        tree = self.tree
        self.layers = tree.layers
        self.layer_size = [tree.size[i] for i in self.layers]
        self.masked = [False] * len(self.layers)
        self.frontier = 0
        self._rebuild_suffix()

    def _rebuild_suffix(self) -> None:
        suffix: list[int | float] = [0] * (len(self.layers) + 1)
        best: int | float = 0
        for k in range(len(self.layers) - 1, -1, -1):
            if not self.masked[k] and self.layer_size[k] > best:
                best = self.layer_size[k]
            suffix[k] = best
        self.suffix = suffix

    def _span(self, item: _Item) -> tuple[int, int]:
        """Return the layer ranks ``[lo, hi)`` inside an item (empty for a tensor)."""
        tree = self.tree
        if type(item) is int:
            return bisect_left(self.layers, item), bisect_left(self.layers, tree.end[item])
        node, _, _, is_buffer = item  # type: ignore[misc]
        edge = bisect_left(self.layers, tree.end[node] if is_buffer else node)
        return edge, edge

    def _reserve(self, lo: int, hi: int) -> int | float:
        """Largest unplaced layer outside ``[lo, hi)``."""
        best = self.suffix[hi]
        for k in range(self.frontier, lo):
            if not self.masked[k] and self.layer_size[k] > best:
                best = self.layer_size[k]
        return best

    def _placed(self, item: _Item, in_order: bool) -> None:
        lo, hi = self._span(item)
        if in_order and lo <= self.frontier:
            self.frontier = max(self.frontier, hi)
        elif hi > lo:
            for k in range(lo, hi):
                self.masked[k] = True
            self._rebuild_suffix()
        while self.frontier < len(self.layers) and self.masked[self.frontier]:
            self.frontier += 1

    # ---- tied parameters ---------------------------------------------------------------------
    def _init_ties(self) -> None:
        tree = self.tree
        self.tied_groups: list[list[tuple[int, str]]] = []
        for group in tree.tied:
            members = []
            for full in group:
                members.append((tree.holder(full), full))
            self.tied_groups.append(members)

    def name(self, item: _Item) -> str:
        """Full name of an item (a module, or a tensor of a split module)."""
        if type(item) is int:
            return self.tree.name_of(item)
        node, local, _, _ = item  # type: ignore[misc]
        owner = self.tree.name_of(node)
        return f"{owner}.{local}" if owner else local

    def _contains(self, item: _Item, node: int, full: str) -> bool:
        if type(item) is int:
            return item <= node < self.tree.end[item]
        return self.name(item) == full

    def _tied_outside(self, item: _Item) -> list[tuple[int, str]]:
        outside: list[tuple[int, str]] = []
        for members in self.tied_groups:
            inside = [self._contains(item, node, full) for node, full in members]
            if any(inside) and not all(inside):
                outside.extend(m for m, flag in zip(members, inside) if not flag)
        return outside

    def _holder(self, stack: list[_Item], node: int, full: str) -> int | None:
        for pos in range(len(stack) - 1, -1, -1):
            if self._contains(stack[pos], node, full):
                return pos
        return None

    def _size(self, item: _Item) -> int | float:
        if type(item) is int:
            return self.tree.size[item]
        return item[2]  # type: ignore[index]

    # ---- splitting ---------------------------------------------------------------------------
    def _splittable(self, item: _Item) -> bool:
        return type(item) is int and self.tree.end[item] > item + 1 and not self.tree.no_split[item]

    def _expand(self, node: int) -> list[_Item]:
        """A split module becomes its own parameters, its children, then its own buffers."""
        own = self.tree.tensors(node)
        params: list[_Item] = [(node, n, s, b) for n, s, b in own if not b]
        buffers: list[_Item] = [(node, n, s, b) for n, s, b in own if b]
        return params + self.tree.kids(node) + buffers

    # ---- main loop ---------------------------------------------------------------------------
    def run(self) -> Plan:
        """Place every item; return the plan."""
        plan = Plan(used=dict.fromkeys(self.devices, 0))
        stack: list[_Item] = self._expand(0)[::-1]
        index = 0
        while stack:
            item = stack.pop()
            device = self.devices[index]
            moved = self._step(item, device, stack, plan)
            if moved:
                index += 1
                stack.append(item)
        plan.used = {d: u for d, u in plan.used.items() if u > 0}
        return plan

    def _log(self, message: str) -> None:
        if self.verbose:
            print(message)

    def _step(self, item: _Item, device: DeviceKey, stack: list[_Item], plan: Plan) -> bool:
        """Place, split or defer one item; return True when the planner must move on a device."""
        size = self._size(item)
        outside = self._tied_outside(item) if self.tied_groups else []
        holders: list[int] = []
        for node, full in outside:
            pos = self._holder(stack, node, full)
            if pos is not None and pos not in holders:
                holders.append(pos)
        with_ties = (
            size
            + sum(self._size(stack[p]) for p in holders)
            - sum(self.tree.tensor_size.get(full, 0) for _, full in outside)
        )
        lo, hi = self._span(item)
        reserved: int | float = 0
        limit: int | float | None = None
        if device != "disk":
            limit = self.max_memory[device]
            if device in self.main:
                reserved = self._reserve(lo, hi)
                limit -= reserved
        used = plan.used[device]
        if limit is None or used + with_ties <= limit:
            self._assign(item, [stack[p] for p in holders], device, stack, plan, size)
            return False
        self._log(
            f"Not enough space on {device} for {self.name(item)} (available {limit - used}, "
            f"needed {with_ties})."
        )
        if holders and used + size <= limit and self._split_tied(item, holders, stack):
            return False
        if used + size >= limit and self._splittable(item):
            self._log(f"Splitting {self.name(item)}.")
            stack.extend(reversed(self._expand(item)))  # type: ignore[arg-type]
            return False
        if used == 0 and self.fallback_allocation and self._fallback(item, device, stack, plan):
            return False
        if used == 0:
            plan.too_small[device] = with_ties + reserved
        plan.used[device] = used + reserved
        self._log(f"{self.name(item)} does not fit on {device}: moving to the next device.")
        return True

    def _assign(
        self,
        item: _Item,
        tied: list[_Item],
        device: DeviceKey,
        stack: list[_Item],
        plan: Plan,
        size: int | float,
    ) -> None:
        extra = sum(self._size(t) for t in tied)
        plan.used[device] += size + extra
        self._log(f"Putting {self.name(item)} (size={size}) on {device}.")
        plan.entries.append((item, device))
        self._placed(item, in_order=True)
        for other in tied:
            stack.remove(other)
            plan.entries.append((other, device))
            self._placed(other, in_order=False)
            self._log(f"Putting tied {self.name(other)} on {device}.")
        if type(item) is int and not self.offload_buffers and device in ("cpu", "disk"):
            plan.offloaded_buffers += self.tree.buffer_size[item]

    def _split_tied(self, item: _Item, holders: list[int], stack: list[_Item]) -> bool:
        for pos in holders:
            other = stack[pos]
            if self._splittable(other):
                self._log(f"Splitting tied {self.name(other)}.")
                stack[pos : pos + 1] = reversed(self._expand(other))  # type: ignore[arg-type]
                stack.append(item)
                return True
        return False

    def _fallback(self, item: _Item, device: DeviceKey, stack: list[_Item], plan: Plan) -> bool:
        """Search (depth first, in order) for any later item that fits the empty device."""
        limit = self.max_memory[device] - max(self._reserve(*self._span(item)), self._size(item))
        search: list[tuple[_Item, tuple[int, ...]]] = [(it, (p,)) for p, it in enumerate(stack)]
        while search:
            candidate, where = search.pop()
            if self._size(candidate) <= limit and not self._tied_outside(candidate):
                self._extract(where, stack)
                stack.append(item)
                stack.append(candidate)
                return True
            if self._splittable(candidate):
                parts = self._expand(candidate)  # type: ignore[arg-type]
                search.extend((part, (*where, k)) for k, part in reversed(list(enumerate(parts))))
        return False

    def _extract(self, where: tuple[int, ...], stack: list[_Item]) -> None:
        """Remove the item at ``where`` (stack position, then child ranks), splitting its parents."""
        pos = where[0]
        if len(where) == 1:
            del stack[pos]
            return
        parts = self._expand(stack[pos])  # type: ignore[arg-type]
        rank = where[1]
        stack[pos : pos + 1] = reversed(parts)
        new_pos = pos + len(parts) - 1 - rank
        self._extract((new_pos, *where[2:]), stack)
