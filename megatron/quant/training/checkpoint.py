"""Checkpoints with megatron-core's distributed checkpointing, on CPU and GPU alike.

Layout (Megatron-LM's)::

    SAVE/latest_checkpointed_iteration.txt        the last complete iteration, written atomically
    SAVE/iter_0000020/                             megatron-core torch_dist checkpoint (+ run_config.json)

A checkpoint is written to ``iter_XXXXXXX.tmp`` and renamed only when every rank is done,
so nothing half-written ever sits under a final name. Sharded tensors make checkpoints
loadable at another tensor-parallel size. Resume restores model, optimizer (with fp32
master weights), LR schedule, iteration (the data position is a function of it) and every
rank's RNG states.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from megatron.quant.layers.delayed import HISTORIES
from megatron.quant.training.checkpoint_files import find_damage, first_line, unreadable_here
from megatron.quant.training.run_tree import RunTree

TRACKER = "latest_checkpointed_iteration.txt"
# Megatron-LM's default for the distributed optimizer: fully parallel I/O, reshardable over DP.
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}
RUN_CONFIG = "run_config.json"
_ITER_DIR = re.compile(r"iter_(\d{7,})")


def iteration_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}")


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; one line naming the directory, the damaged file
    and the intact checkpoints to fall back to."""


def latest_iteration(root: str) -> int | None:
    """The iteration in ``root``'s tracker file; None when there is no checkpoint yet."""
    path = os.path.join(root, TRACKER)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        text = f.read().strip()
    if not text.isdigit():
        raise CheckpointError(f"{path} holds {text!r}, not an iteration number; {fallback_hint(root)}")
    return int(text)


def intact_iterations(root: str) -> list[int]:
    """Iterations under ``root`` whose ``iter_*`` directory passes ``find_damage``, oldest first."""
    found = []
    for name in os.listdir(root) if os.path.isdir(root) else ():
        match = _ITER_DIR.fullmatch(name)
        if match and find_damage(os.path.join(root, name)) is None:
            found.append(int(match.group(1)))
    return sorted(found)


def fallback_hint(root: str) -> str:
    """What to do instead: the intact checkpoints and how to load one."""
    intact = intact_iterations(root)
    if not intact:
        return f"no intact checkpoint under {root}"
    return (f"intact checkpoints under {root}: iterations {', '.join(map(str, intact))}; "
            f"load one with --load {root} --ckpt-step N, or fix {os.path.join(root, TRACKER)}")


def resolve_checkpoint_dir(path: str, step: int | None = None) -> str:
    """Iteration ``step``'s checkpoint under ``path``; without ``step``, ``path`` itself if it
    is one iteration's checkpoint, else the tracker's. CheckpointError when that directory is
    absent."""
    if step is None and os.path.isfile(os.path.join(path, RUN_CONFIG)):
        return path
    iteration = step if step is not None else latest_iteration(path)
    if iteration is None:
        raise FileNotFoundError(f"no checkpoint in {path!r}: neither {TRACKER} nor {RUN_CONFIG}")
    directory = iteration_dir(path, iteration)
    if not os.path.isdir(directory):
        source = (f"--ckpt-step {step}" if step is not None
                  else f"{os.path.join(path, TRACKER)} names iteration {iteration} but")
        raise CheckpointError(f"{source} {directory} does not exist; {fallback_hint(path)}")
    return directory


def verified_checkpoint_dir(path: str, step: int | None = None) -> str:
    """``resolve_checkpoint_dir``, then CheckpointError when a file of that checkpoint is damaged
    or the installed megatron-core cannot read its layout."""
    directory = resolve_checkpoint_dir(path, step)
    damage = find_damage(directory)
    if damage is not None:
        root = os.path.dirname(os.path.normpath(directory))
        raise CheckpointError(f"checkpoint {directory} is damaged: {damage}; {fallback_hint(root)}")
    reason = unreadable_here(directory)
    if reason is not None:
        raise CheckpointError(f"checkpoint {directory} cannot be loaded here: {reason}")
    return directory


def read_run_config(path: str) -> dict:
    with open(os.path.join(resolve_checkpoint_dir(path), RUN_CONFIG)) as f:
        return json.load(f)


def _precision(args: dict) -> str:
    return "bf16" if args.get("bf16") else "fp16" if args.get("fp16") else "fp32"


def _layout(args: dict) -> tuple:
    return tuple(args.get(key) for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                           "data_parallel_size"))


def check_resume(directory: str, tree: RunTree) -> None:
    """Refuse at start, from ``directory``'s run config, a resume that loading would refuse deep
    inside megatron-core or that would train nothing: ``--train-iters`` below the checkpoint's
    iteration, another parallel layout with its RNG states restored, another precision with its
    optimizer state loaded. CheckpointError naming both values and the flag that makes it work."""
    match = _ITER_DIR.fullmatch(os.path.basename(os.path.normpath(directory)))
    train_iters = tree.schedule.train_iters
    if match and int(match.group(1)) > train_iters:
        raise CheckpointError(f"--train-iters {train_iters} is below the iteration of checkpoint {directory} "
                              f"({int(match.group(1))}); give --train-iters {int(match.group(1))} or more, or load "
                              f"an earlier one with --ckpt-step N")
    with open(os.path.join(directory, RUN_CONFIG), encoding="utf-8") as f:
        config = json.load(f)  # parsed already by find_damage; its shape is not checked there
    saved = config.get("args") if isinstance(config, dict) else None
    saved = saved if isinstance(saved, dict) else {}
    now = tree.flags()
    if not tree.checkpoint.no_load_rng and None not in _layout(saved) and _layout(saved) != _layout(now):
        raise CheckpointError(
            "checkpoint {} was saved at TP {} x PP {} x DP {}, this run is TP {} x PP {} x DP {}: RNG states resume "
            "only at the saved layout; add --no-load-rng (weights and optimizer state reshard)".format(
                directory, *_layout(saved), *_layout(now)))
    if not tree.checkpoint.no_load_optim and _precision(saved) != _precision(now):
        raise CheckpointError(f"checkpoint {directory} was saved with precision {_precision(saved)}, this run uses "
                              f"{_precision(now)}: the optimizer state differs; resume with the saved precision, or "
                              f"add --no-load-optim to take the weights only")


def _rng_state() -> dict:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
            "tracker": get_cuda_rng_tracker().get_states()}


def _set_rng_state(state: dict) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def _rng_sharded_object(state: Any):
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    return ShardedObject(
        "rng_state", state,
        (ps.get_pipeline_model_parallel_world_size(), ps.get_tensor_model_parallel_world_size(),
         ps.get_data_parallel_world_size()),
        (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank(), ps.get_data_parallel_rank()),
        replica_id=0)


def _sharded_state(model, optimizer, scheduler, iteration: int, *, is_loading: bool, rng: bool) -> dict:
    model_sd = model.sharded_state_dict()
    state = {"model": model_sd, "iteration": iteration}
    if rng:
        state["rng"] = _rng_sharded_object(_rng_state())
    if optimizer is not None:
        state["optimizer"] = optimizer.sharded_state_dict(model_sd, is_loading=is_loading,
                                                          metadata=OPTIMIZER_METADATA)
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    return state


def _absent_histories(model_template: dict, saved: dict) -> set[str]:
    """State-dict names of the model's delayed-scaling histories the checkpoint does not hold (it
    was saved under a recipe without them): left out of the load, so they keep their fresh state."""
    return {name for name, item in model_template.items()
            if f".{HISTORIES}." in name and getattr(item, "key", name) not in saved}


def shape_mismatch(model_template: dict, saved: dict, saved_shape: dict | None, shape: dict | None) -> str | None:
    """The first tensor whose saved global shape differs from the model's: its key, both shapes
    and the flag that differs when the run configs tell (None when all agree). Checked before
    loading, where torch's CheckpointException (a BaseException) would end every rank in a traceback."""
    for item in model_template.values():
        key, expected = getattr(item, "key", None), getattr(item, "global_shape", None)
        if key not in saved or expected is None or tuple(saved[key].global_shape) == tuple(expected):
            continue
        found = tuple(saved[key].global_shape)
        if key.rsplit(".", 1)[-1] == "amax_history":
            cause = f"the amax history length differs: saved {found[-1]}, now {expected[-1]} (--fp8-amax-history-len " \
                    f"or the recipe's amax_history_len)"
        else:
            differing = [f"--{k.replace('_', '-')} saved {saved_shape[k]}, now {shape[k]}" for k in shape or {}
                         if saved_shape and k in saved_shape and saved_shape[k] != shape[k]]
            cause = "; ".join(differing) or "another model shape"
        return f"{key} has shape {list(found)} in the checkpoint but {list(expected)} in this model ({cause})"
    return None


def _saved_shape(directory: str) -> dict | None:
    try:
        with open(os.path.join(directory, RUN_CONFIG)) as f:
            return json.load(f).get("shape")
    except (OSError, ValueError, AttributeError):
        return None


def save_checkpoint(root: str, iteration: int, model, optimizer, scheduler, run_config: dict) -> str:
    """Save on every rank (collective); returns the final directory.

    ``model``: the unwrapped GPTModel; ``run_config``: JSON-able (shape and arguments).
    """
    from megatron.core import dist_checkpointing

    final = iteration_dir(root, iteration)
    tmp = final + ".tmp"
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    dist.barrier()
    dist_checkpointing.save(_sharded_state(model, optimizer, scheduler, iteration, is_loading=False, rng=True), tmp)
    dist.barrier()
    if dist.get_rank() == 0:
        _write_atomically(os.path.join(tmp, RUN_CONFIG), json.dumps(run_config, indent=1, default=str))
        if os.path.exists(final):  # re-saving the same iteration replaces it
            shutil.rmtree(final)
        os.replace(tmp, final)
        _write_atomically(os.path.join(root, TRACKER), str(iteration))
    dist.barrier()
    return final


def load_checkpoint(path: str, model, optimizer=None, scheduler=None, *, restore_rng: bool = True,
                    step: int | None = None, shape: dict | None = None) -> int:
    """Load into ``model`` (unwrapped GPTModel) and, when given, optimizer and scheduler; returns the iteration.

    ``step``: load that iteration instead of the tracker's (``--ckpt-step``). Weights load at
    any tensor-parallel size (sharded tensors are resharded); the RNG states (``restore_rng``,
    for exact resume) only at the saving run's parallel layout. A damaged or missing
    checkpoint is a CheckpointError naming the file and the intact checkpoints; one saved with
    another model shape (``shape``: this run's, to name the flag) or amax history length is a
    CheckpointError naming the tensor and both shapes.
    """
    from megatron.core import dist_checkpointing
    from torch.distributed.checkpoint.api import CheckpointException

    directory = verified_checkpoint_dir(path, step)
    root = os.path.dirname(os.path.normpath(directory))
    template = _sharded_state(model, optimizer, scheduler, 0, is_loading=True, rng=restore_rng)
    try:
        saved = dist_checkpointing.load_tensors_metadata(directory)
        mismatch = shape_mismatch(template["model"], saved, _saved_shape(directory), shape)
        if mismatch is not None:
            raise CheckpointError(f"checkpoint {directory} does not fit this model: {mismatch}; resume with the "
                                  f"saved settings or start without --load")
        fresh = _absent_histories(template["model"], saved)
        template["model"] = {k: v for k, v in template["model"].items() if k not in fresh}
        state = dist_checkpointing.load(template, directory)
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as error:  # damage find_damage cannot see (e.g. flipped bytes)
        raise CheckpointError(f"checkpoint {directory} cannot be loaded ({type(error).__name__}: {first_line(error)}); "
                              f"{fallback_hint(root)}") from error
    if fresh and dist.get_rank() == 0:
        print(f"checkpoint {directory} holds no delayed-scaling amax history for {len(fresh)} operand buffer(s) "
              f"(saved under another recipe): they start fresh, each operand's first scale 1", flush=True)
    missing, unexpected = model.load_state_dict(state["model"], strict=False)
    bad = [k for k in missing + unexpected if not k.endswith("_extra_state") and k not in fresh]
    if bad:
        raise ValueError(f"checkpoint {directory} does not match the model: {bad[:5]}")
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])
    if restore_rng:
        _set_rng_state(state["rng"])
    return int(state["iteration"])
