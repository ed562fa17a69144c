"""Capture file and manifest names (docs/interfaces.md section 2); the one place that spells them."""
from __future__ import annotations

import os
import re
from datetime import datetime
from typing import Mapping, Optional

from megatron.quant.settings.names import NAME_RULE, name_problem

FILE_NAME_RE = re.compile(
    r"^(?P<timestamp>\d{8}_\d{6})_(?P<counter>\d{4,})_iter(?P<iteration>\d{3,})"
    r"_(?P<layer_type>attention|linear)_L(?P<layer_idx>-?\d+)_(?P<operation>forward|backward)"
    r"_(?P<phase>pre|post)_(?P<component>FA|linear)_(?P<quant_type>[A-Za-z0-9.+-]+(?:_[A-Za-z0-9.+-]+)*?)"
    r"_rank(?P<rank>\d{2,})_sample(?P<sample>\d{3,})_(?P<tensor_name>[A-Za-z0-9_]+)\.pt$"
)
MANIFEST_RE = re.compile(r"^manifest-rank\d{2,}\.jsonl$")
_INT_FIELDS = ("counter", "iteration", "layer_idx", "rank", "sample")



def timestamp_token(moment: datetime) -> str:
    return moment.strftime("%Y%m%d_%H%M%S")


def file_name(metadata: Mapping, counter: int) -> str:
    """The capture file name for ``metadata`` (saved_at is ISO 8601) and this rank's ``counter``."""
    m = metadata
    stamp = timestamp_token(datetime.fromisoformat(m["saved_at"]))
    name = (f"{stamp}_{counter:04d}_iter{m['iteration']:03d}_{m['layer_type']}_L{m['layer_idx']}"
            f"_{m['operation']}_{m['phase']}_{m['component']}_{m['quant_type']}"
            f"_rank{m['rank']:02d}_sample{m['sample']:03d}_{m['tensor_name']}.pt")
    if not FILE_NAME_RE.match(name):  # e.g. a separator in a token: the file would land elsewhere
        raise ValueError(f"capture file name {name!r} is invalid; allowed: names matching FILE_NAME_RE")
    return name


def capture_directory(save_dir: str, quant_type: str) -> str:
    """``save_dir/quant_type``; ValueError unless ``quant_type`` is one path component inside ``save_dir``."""
    if name_problem(quant_type) is not None:  # the recipe's name: checked when the recipe was read
        raise ValueError(f"quant_type={quant_type!r} is invalid; allowed: {NAME_RULE}")
    return os.path.join(save_dir, quant_type)


def parse_file_name(name: str) -> Optional[dict]:
    """The fields of a capture file name (numbers as int), or None if it is not one."""
    match = FILE_NAME_RE.match(name)
    if match is None:
        return None
    return {key: int(value) if key in _INT_FIELDS else value for key, value in match.groupdict().items()}


def manifest_name(rank: int) -> str:
    return f"manifest-rank{rank:02d}.jsonl"


def temporary_name(final_name: str, pid: int) -> str:
    """Hidden, not ending in .pt: a writer killed mid-save never leaves a final-looking name."""
    return f".{final_name}.{pid}.tmp"
