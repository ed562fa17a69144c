"""The work model of the quantization kernels: what each specialization must move (bytes a processed
element) and what it executes (SASS instructions a processed element), against an instruction budget
derived from the H100's ratio of issue rate to memory bandwidth. ``kernel_build --cubin`` fills its rows
from the cubins it compiles; the tests hold the budget (tests/kernels/test_gpu_build.py).

The machine balance (H100 SXM5, NVIDIA's datasheet and the Hopper whitepaper): 132 SMs, each with 4
warp schedulers issuing one warp instruction (32 threads) a clock, at the 1.98 GHz boost clock, is
33.4 T thread instructions a second; HBM3 moves 3.35 TB/s. A kernel that moves B bytes an element
is memory-bound as long as it executes fewer than B x 9.99 thread instructions an element, at a
full issue rate that nothing reaches (latency, the MUFU and integer-multiply units' lower rates);
a class's goal share of copy bandwidth tightens that in proportion.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

H100_SMS = 132
H100_SCHEDULERS_PER_SM = 4  # one warp instruction a clock each
H100_WARP_SIZE = 32
H100_BOOST_HZ = 1.98e9
H100_HBM_BYTES_PER_S = 3.35e12
ISSUE_PER_S = H100_SMS * H100_SCHEDULERS_PER_SM * H100_WARP_SIZE * H100_BOOST_HZ
INSTRUCTIONS_PER_BYTE = ISSUE_PER_S / H100_HBM_BYTES_PER_S
"""Thread instructions an H100 issues in the time its HBM moves one byte (9.99)."""

# The kernel classes and the share of copy bandwidth each must reach (the kernels' goals): the
# budget is the instructions that take that long at the full issue rate. Statistics in the pass may
# take 1.1x the cast; the amax reduction only reads.
GOAL_SHARE = {"cast": 0.85, "both axes": 0.70, "hadamard or stochastic": 0.50, "statistics": 0.85 / 1.1,
              "amax": 0.85}

_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)[.\s;]", re.M)
_BRANCH_TARGET = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?BRA\s+`?\(?\.L_x_(\d+)")
_LABEL = re.compile(r"^\.L_x_(\d+):\s*$", re.M)
_ADDRESS = re.compile(r"/\*([0-9a-f]{4,})\*/")


def sass_counts(sass: str) -> dict[str, int]:
    """A kernel's SASS (``nvdisasm -c``), counted statically: every instruction but the NOP padding and
    the closing self-branch after the last EXIT; its global loads and stores; its backward branches
    (loops: with none, each thread runs each instruction at most once)."""
    opcodes = _INSTRUCTION.findall(sass)
    if not opcodes:
        raise ValueError("no SASS instructions found in the disassembly")
    while opcodes and opcodes[-1] in ("NOP", "BRA"):  # the padding and the trailing `BRA .` after EXIT
        opcodes.pop()
    labels = {}
    lines = sass.splitlines()
    for index, line in enumerate(lines):
        found = _LABEL.match(line)
        if found:  # a label's address: the next instruction's
            following = next((_ADDRESS.search(after) for after in lines[index + 1:] if _ADDRESS.search(after)), None)
            labels[found.group(1)] = int(following.group(1), 16) if following else None
    backward = sum(1 for address, label in _BRANCH_TARGET.findall(sass)  # the closing `BRA .` targets itself
                   if labels.get(label) is not None and labels[label] < int(address, 16))
    return {"instructions": sum(1 for op in opcodes if op != "NOP"),
            "global_loads": sum(1 for op in opcodes if op == "LDG"),
            "global_stores": sum(1 for op in opcodes if op in ("STG", "RED", "ATOMG")),
            "backward_branches": backward}


MODELLED = ("_elementwise_kernel", "_amax_kernel", "_fold_kernel", "_history_kernel", "_block_kernel", "_dual_kernel")
"""The quantization kernels, bound by the bytes they move; the accumulation model's GEMM kernel
(``kernels/accumulate.py``) and attention's are not, and have no budget here."""


INPUT = {"_history_kernel": 1}
"""The position among a launch's tensors of the one whose elements it processes, where not the first (the history
kernel's first is the 0-d amax it appends)."""


def program_elements(kernel: str, constants: Mapping[str, Any]) -> int:
    """Elements of the tensor one program of ``kernel`` processes (the padding of a block to a power
    of two is work, not elements)."""
    if kernel in ("_elementwise_kernel", "_amax_kernel"):
        return constants["BLOCK_SIZE"]
    if kernel in ("_fold_kernel", "_history_kernel"):  # one program: a step of its loop (rows, history entries)
        return constants["BLOCK_SIZE"]
    if kernel == "_block_kernel":
        return constants["LAYOUT"].block * constants["LAYOUT"].columns
    if kernel == "_dual_kernel":
        return constants["B"] ** 2
    raise ValueError(f"no work model for kernel {kernel!r}; known: {', '.join(MODELLED)}")


def bytes_per_element(tensors: list, elements: int) -> float:
    """Bytes the launch must move for each of its ``elements`` input elements: every distinct tensor
    it is given (the input, its outputs, scales, statistics rows, a tensor scale) once; a tensor passed
    again as an unused placeholder counts once."""
    seen, total = set(), 0
    for tensor in tensors:
        key = tensor.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total / elements


def kernel_class(kernel: str, constants: Mapping[str, Any]) -> str:
    """The class whose goal share budgets this specialization (``GOAL_SHARE``)."""
    if kernel in ("_amax_kernel", "_fold_kernel", "_history_kernel") or constants.get("AMAX_ONLY"):
        return "amax"
    if constants.get("STATS"):
        return "statistics"
    if kernel == "_dual_kernel":  # a per-tensor scale's two layouts are one cast's values
        return "both axes"
    rht = constants.get("RHT")
    if constants.get("STOCHASTIC") or (rht is not None and rht.log2):
        return "hadamard or stochastic"
    return "cast"


def budget(bytes_moved: float, klass: str) -> float:
    """Instructions an element may take for its class to reach its goal share of copy bandwidth at the
    H100's full issue rate."""
    return INSTRUCTIONS_PER_BYTE * bytes_moved / GOAL_SHARE[klass]


def work_row(kernel: str, constants: Mapping[str, Any], tensors: list, counts: Mapping[str, int],
             num_warps: int) -> dict:
    """One specialization's work: bytes and instructions a processed element, its class and budget."""
    elements = program_elements(kernel, constants)
    per_thread = elements / (num_warps * H100_WARP_SIZE)
    moved = bytes_per_element(tensors, tensors[INPUT.get(kernel, 0)].numel())
    klass = kernel_class(kernel, constants)
    per_element = counts["instructions"] / per_thread
    return {"class": klass, "bytes_per_element": round(moved, 3), "elements_per_thread": per_thread,
            "sass_instructions": counts["instructions"], "backward_branches": counts["backward_branches"],
            "instructions_per_element": round(per_element, 2), "budget_per_element": round(budget(moved, klass), 2),
            "over_budget": per_element > budget(moved, klass)}
