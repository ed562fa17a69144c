"""Graph safety, checked on the CPU: what in a step would break, or be silently frozen by, a CUDA graph.

A CUDA graph records the kernels a step launches once and replays them: the host runs none of the
step's Python again. So a step is safe to graph when

- it never makes the host wait for the device (a host synchronisation: ``.item()``, ``bool(t)``,
  ``torch.equal``, an op whose output shape depends on the values, such as ``nonzero`` or a boolean
  mask's indexing): inside a capture these fail;
- its shapes and its work are the same at every step (the replay runs the captured ones);
- every host value it hands the device (a Python number an op takes, a tensor made from host data) is
  the same at every step: the replay keeps the captured value, so a value that changes (a stochastic-
  rounding key derived from the iteration, a position-dependent choice) would be frozen;
- every tensor it reads that was made before the step (parameters, buffers, inputs, caches) is at the
  same address at every step: the replay reads the captured addresses.

``GraphSafety`` is a ``TorchDispatchMode`` that records each aten op of a step run under it: its name,
where in our or megatron-core's code it was called from, its host values and its tensors' shapes; host
synchronisations, data-dependent shapes and the ops that allocate are listed. ``replay_hazards``
compares two steps' records: any difference in the work, the shapes, the host values or the addresses
of what the step reads from before it is one that a graph captured on the first step would get wrong
on the second. On the CPU only reads that go through
aten are seen: ``.tolist()``, ``.numpy()`` and ``.cpu()`` of a CPU tensor dispatch nothing (on a GPU
``.cpu()`` and ``.tolist()`` are a ``_to_copy`` to the host, which is counted).
"""
from __future__ import annotations

import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# Ops that read a value back to the host (``item``, ``bool``, ``float`` all reach _local_scalar_dense).
HOST_READS = frozenset({"_local_scalar_dense", "item", "equal", "allclose", "is_nonzero"})
# Ops whose output shape depends on the values: the host must wait to learn it.
DATA_DEPENDENT_SHAPES = frozenset({"nonzero", "masked_select", "unique", "_unique2", "unique_consecutive",
                                   "unique_dim", "repeat_interleave", "argwhere"})
# Ops that make or reshape nothing the device computes (views are told by ``func.is_view``).
NO_WORK = frozenset({"detach", "lift_fresh", "_unsafe_view", "alias", "size", "stride", "is_same_size",
                     "_has_compatible_shallow_copy_type", "set_", "resize_"})
HOST_DATA_SHOWN = 64  # a tensor of host data up to this size is compared by value between steps
OUR_CODE = ("/megatron/",)  # where a place is looked for: our package and megatron-core
SKIPPED_CODE = ("/graph_safety.py", "/torch/")  # frames that are never a place


@dataclass(frozen=True)
class OpCall:
    """One aten op of a step: its name, where it was called from, its host values and its tensors'
    shapes (the parts of a call a CUDA graph keeps from the capture)."""

    op: str
    place: str
    host_values: tuple
    shapes: tuple
    outside: tuple  # (argument index, storage address) of each input made before the step


@dataclass(frozen=True)
class Finding:
    """A graph-safety problem: its kind, the op and the place it was called from."""

    kind: str  # "host sync", "data-dependent shape", "step differs", "shape differs", "host value differs",
    # "input moved"
    op: str
    place: str
    detail: str = ""

    def line(self) -> str:
        return f"{self.kind}: {self.op} at {self.place}" + (f" ({self.detail})" if self.detail else "")


def _place() -> str:
    """file:line (function) of the innermost frame in megatron code calling the op; else the innermost
    frame outside torch (a test, a script)."""
    frame, fallback = sys._getframe(2), None
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if not any(part in name for part in SKIPPED_CODE):
            here = f"{_short(name)}:{frame.f_lineno} ({frame.f_code.co_name})"
            if any(part in name for part in OUR_CODE):
                return here
            fallback = fallback or here
        frame = frame.f_back
    return fallback or "?"


def _short(path: str) -> str:
    """A path from its ``megatron/`` directory on (``megatron/quant/layers/operand.py``)."""
    at = path.rfind("/megatron/")
    return path[at + 1:] if at >= 0 else path


def _host_value(leaf: Any) -> Any:
    """What a graph keeps of a host argument: a number or a name as it is, any other object (a process
    group, say) by its type."""
    if isinstance(leaf, float) and math.isnan(leaf):
        return "nan"  # equal to itself, as the same NaN argument is
    if leaf is None or isinstance(leaf, (bool, int, float, complex, str)):
        return leaf
    return str(leaf) if isinstance(leaf, (torch.dtype, torch.device, torch.layout, torch.memory_format)) \
        else f"<{type(leaf).__name__}>"


def _address(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _boolean_index(name: str, args: tuple) -> bool:
    """Indexing with a boolean mask: the selected count is data-dependent, except ``x[mask] = scalar``,
    which torch runs as ``masked_fill_`` (a one-element value, not accumulated)."""
    if name not in ("index", "index_put", "index_put_") or not any(
            isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in tree_flatten(args[1])[0]):
        return False
    return name == "index" or args[2].numel() != 1 or bool(args[3:] and args[3])


@dataclass
class StepRecord:
    """What one step ran: every op in order, and the graph-safety findings of the step on its own."""

    calls: list[OpCall] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    allocations: Counter = field(default_factory=Counter)  # op -> how many fresh tensors it made

    def lines(self) -> list[str]:
        """One line per distinct finding, with how many times it happened."""
        counts = Counter(finding.line() for finding in self.findings)
        return [line + (f" x{n}" if n > 1 else "") for line, n in counts.items()]


class GraphSafety(TorchDispatchMode):
    """Records the ops run under it into ``record`` (a ``StepRecord``); see the module's docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.record = StepRecord()
        self._made: set[int] = set()  # storage addresses of the tensors the step made

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name == "lift_fresh":  # a tensor of host data: a graph keeps its values, as it keeps a host number
            self._made.add(_address(out))
            values = tuple(out.reshape(-1).tolist()) if out.numel() <= HOST_DATA_SHOWN else ("<data>",)
            self.record.calls.append(OpCall("lift_fresh.default", _place(), values, (tuple(out.shape),), ()))
        if func.is_view or name in NO_WORK:
            return out
        leaves = tree_flatten((args, kwargs))[0]
        place = _place()
        host = tuple(_host_value(leaf) for leaf in leaves if not isinstance(leaf, torch.Tensor))
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        shapes = tuple(tuple(t.shape) for t in tensors)
        outside = tuple((i, address) for i, address in enumerate(map(_address, tensors)) if address not in self._made)
        self._made.update(_address(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        self.record.calls.append(OpCall(f"{name}.{func._overloadname}", place, host, shapes, outside))
        if name in HOST_READS:
            self.record.findings.append(Finding("host sync", name, place))
        elif name in DATA_DEPENDENT_SHAPES or _boolean_index(name, args):
            self.record.findings.append(Finding("data-dependent shape", name, place))
        elif name == "_to_copy" and leaves[0].device.type != "cpu" and kwargs.get("device") == torch.device("cpu"):
            self.record.findings.append(Finding("host sync", "copy to the host", place))
        if not name.endswith("_") and "out" not in kwargs:
            self.record.allocations[name] += sum(isinstance(t, torch.Tensor) for t in tree_flatten(out)[0])
        return out


class CudaOnCpu(TorchFunctionMode):
    """Tensors asked for on ``cuda`` made on the CPU instead: code written for the GPU only (megatron-core's
    schedule makes its token count with ``device="cuda"``) runs on the CPU under the checker."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def replay_hazards(first: StepRecord, second: StepRecord, limit: int = 20) -> list[Finding]:
    """What a graph captured on step ``first`` would replay wrongly on step ``second``: the first op
    where their work differs (then nothing after it is compared), and every op whose shapes or host
    values differ; at most ``limit`` findings."""
    found: list[Finding] = []
    for a, b in zip(first.calls, second.calls):
        if (a.op, a.place) != (b.op, b.place):
            found.append(Finding("step differs", a.op, a.place, f"the next step runs {b.op} at {b.place}"))
            return found[:limit]
        if a.shapes != b.shapes:
            found.append(Finding("shape differs", a.op, a.place, f"{a.shapes} then {b.shapes}"))
        elif a.host_values != b.host_values:
            found.append(Finding("host value differs", a.op, a.place, f"{_shown(a.host_values)} then "
                                 f"{_shown(b.host_values)}"))
        elif any(address != dict(b.outside).get(i, address) for i, address in a.outside):
            found.append(Finding("input moved", a.op, a.place, "a tensor made before the step is at another "
                                                               "address at the next step"))
    if len(first.calls) != len(second.calls):
        shorter = min(len(first.calls), len(second.calls))
        extra = (first.calls if len(first.calls) > shorter else second.calls)[shorter]
        found.append(Finding("step differs", extra.op, extra.place,
                             f"{len(first.calls)} ops then {len(second.calls)}"))
    return found[:limit]


def _shown(values: tuple, width: int = 60) -> str:
    text = repr(values)
    return text if len(text) <= width else text[:width - 3] + "..."


def replay_hazards_of(records: list[StepRecord]) -> list[Finding]:
    """``replay_hazards`` between each step and the next, each distinct one once."""
    hazards: dict[str, Finding] = {}
    for a, b in zip(records, records[1:]):
        for finding in replay_hazards(a, b):
            hazards.setdefault(finding.line(), finding)
    return list(hazards.values())


def check(step: Callable[[], object], steps: int = 2) -> tuple[list[StepRecord], list[Finding]]:
    """Run ``step()`` (a quantized layer's forward and backward, say) ``steps`` times, each under
    ``GraphSafety``: (each step's record, ``replay_hazards_of`` them)."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    records = []
    for _ in range(steps):
        with GraphSafety() as mode:
            step()
        records.append(mode.record)
    return records, replay_hazards_of(records)


def summary(records: list[StepRecord], hazards: list[Finding], allocations: Optional[int] = 10) -> str:
    """A report: the findings of each step on its own, the replay hazards, the ops that allocate most."""
    lines = [f"step {i + 1}: {len(record.calls)} ops, " + (f"{len(record.findings)} findings" if record.findings
                                                          else "no host sync, no data-dependent shape")
             for i, record in enumerate(records)]
    seen = {line for record in records for line in record.lines()}
    lines += [f"  {line}" for line in sorted(seen)]
    lines.append(f"replay hazards: {len(hazards)}" if hazards else "replay hazards: none (the steps ran the same "
                                                                  "ops, shapes and host values)")
    lines += [f"  {finding.line()}" for finding in hazards]
    if allocations and records:
        top = records[-1].allocations.most_common(allocations)
        lines.append("fresh tensors a step makes, by op: " + ", ".join(f"{op} {n}" for op, n in top))
    return "\n".join(lines)
