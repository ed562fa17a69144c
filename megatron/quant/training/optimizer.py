"""Optimizer and learning-rate schedule.

CPU: :class:`CpuAdamW`, torch AdamW over fp32 master weights, fed from megatron-core DDP's
``param.main_grad`` (megatron-core's own optimizers allocate on CUDA). It mirrors the
``MegatronOptimizer`` calls the loop makes (``step``, ``zero_grad``, ``param_groups``,
``sharded_state_dict``, ``load_state_dict``), so the loop and checkpointing treat both alike.
GPU: megatron-core's ``get_megatron_optimizer`` (distributed optimizer on request).
Both run under megatron-core's ``OptimizerParamScheduler``.
"""
from __future__ import annotations

from typing import Iterable

import torch

from megatron.quant.training.run_tree import RunTree


def _no_weight_decay(name: str, param: torch.nn.Parameter) -> bool:
    # Megatron's default: no weight decay on biases and 1-D parameters (norm weights).
    return param.dim() == 1 or name.endswith(".bias")


class CpuAdamW:
    """AdamW on fp32 master copies of (possibly bf16) parameters; gradients from ``main_grad``."""

    def __init__(self, named_params: Iterable[tuple[str, torch.nn.Parameter]], *, lr: float,
                 weight_decay: float, betas: tuple[float, float], eps: float, clip_grad: float) -> None:
        decay, no_decay = [], []
        for name, param in named_params:
            if param.requires_grad:
                (no_decay if _no_weight_decay(name, param) else decay).append(param)
        # Model params in optimizer order: the order the sharded checkpoint maps state by.
        self.model_params = decay + no_decay
        self.master_params = [p if p.dtype == torch.float32 else p.detach().float().requires_grad_()
                              for p in self.model_params]
        masters = iter(self.master_params)
        groups = [dict(params=[next(masters) for _ in decay], wd_mult=1.0),
                  dict(params=[next(masters) for _ in no_decay], wd_mult=0.0)]
        self.optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr,
                                           weight_decay=weight_decay, betas=betas, eps=eps)
        self.clip_grad = clip_grad

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def grad_norm(self) -> torch.Tensor:
        """L2 norm of the full (all TP shards) gradient, TP-replicated params counted once: a float64
        tensor, not read back (the loop reads it at its logging interval). Expert-parallel parameters
        (megatron-core marks them ``allreduce=False``) differ across expert-parallel ranks: their squares
        are summed over the expert model-parallel group, the others' over the model-parallel group, as
        megatron-core's optimizers do, so every rank clips by the same norm."""
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        sq = torch.zeros((), dtype=torch.float64)
        for expert, group in ((False, parallel_state.get_model_parallel_group()),
                              (True, parallel_state.get_expert_tensor_model_pipeline_parallel_group())):
            params = [p for p in self.model_params if (not getattr(p, "allreduce", True)) == expert]
            if not params:
                continue
            part = torch.zeros((), dtype=torch.float64)
            for param in params:
                if param_is_not_tensor_parallel_duplicate(param):
                    part += param.main_grad.double().square().sum()
            if torch.distributed.get_world_size(group) > 1:
                torch.distributed.all_reduce(part, group=group)
            sq += part
        return sq.sqrt()

    def step(self) -> tuple[bool, torch.Tensor, None]:
        """Clip, update masters, copy them into the model; no host synchronisation (the clip factor
        stays a tensor). Returns (True, grad norm, None) like megatron-core."""
        norm = self.grad_norm()
        scale = (self.clip_grad / (norm + 1e-6)).clamp(max=1.0) if self.clip_grad > 0 else 1.0
        for model_param, master in zip(self.model_params, self.master_params):
            master.grad = model_param.main_grad.float() * scale  # a copy: main_grad is DDP's buffer
        self.optimizer.step()
        with torch.no_grad():
            for model_param, master in zip(self.model_params, self.master_params):
                if master is not model_param:
                    model_param.copy_(master)
        return True, norm, None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for master in self.master_params:
            master.grad = None

    def _init_state(self) -> None:
        for master in self.master_params:
            state = self.optimizer.state[master]
            if not state:
                state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(master),
                             exp_avg_sq=torch.zeros_like(master))

    def sharded_state_dict(self, model_sharded_state_dict: dict, is_loading: bool = False,
                           metadata: dict | None = None) -> dict:
        """Optimizer state as megatron-core ShardedTensors laid out like the model's parameters.

        ``metadata`` (megatron-core's distributed-optimizer options) does not apply here.
        """
        from megatron.core.dist_checkpointing.optimizer import (
            get_param_id_to_sharded_param_map,
            make_sharded_optimizer_tensor,
            optim_state_to_sharding_state,
        )

        if is_loading:
            self._init_state()
        state = self.optimizer.state_dict()
        id_map = get_param_id_to_sharded_param_map(model_sharded_state_dict, self.model_params)
        steps = {float(s["step"]) for s in state["state"].values()}
        if len(steps) > 1:
            raise RuntimeError(f"optimizer steps differ across parameters: {sorted(steps)}")
        optim_state_to_sharding_state(state, id_map, exclude_keys=("step",))
        state["common_step"] = steps.pop() if steps else 0.0
        state["fp32_params"] = {
            i: make_sharded_optimizer_tensor(id_map[i], master, prefix="optimizer.state.fp32_param")
            for i, (model_param, master) in enumerate(zip(self.model_params, self.master_params))
            if master is not model_param}
        return state

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            for i, master in state.pop("fp32_params").items():
                self.master_params[i].copy_(master)
        step = torch.tensor(state.pop("common_step"))
        for param_state in state["state"].values():
            param_state["step"] = step.clone()
        state["param_groups"] = [
            dict(saved, params=own["params"]) for saved, own in zip(state["param_groups"],
                                                                    self.optimizer.state_dict()["param_groups"])]
        self.optimizer.load_state_dict(state)


def build_optimizer(tree: RunTree, model_chunks: list, cuda: bool):
    """CpuAdamW on CPU; megatron-core's optimizer (distributed with --use-distributed-optimizer) on GPU."""
    args, precision = tree.optimizer, tree.precision
    if not cuda:
        named = [item for chunk in model_chunks for item in chunk.named_parameters()]
        return CpuAdamW(named, lr=args.lr, weight_decay=args.weight_decay,
                        betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_eps, clip_grad=args.clip_grad)
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    config = OptimizerConfig(
        optimizer="adam", lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay,
        adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
        clip_grad=args.clip_grad, bf16=precision.bf16, fp16=precision.fp16,
        params_dtype=torch.bfloat16 if precision.bf16 else torch.float16 if precision.fp16 else torch.float32,
        use_distributed_optimizer=args.use_distributed_optimizer)
    return get_megatron_optimizer(config, model_chunks)


def build_scheduler(tree: RunTree, optimizer):
    """megatron-core's OptimizerParamScheduler, stepped once per iteration."""
    args = tree.optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    return OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=args.lr, min_lr=args.min_lr,
        lr_warmup_steps=args.lr_warmup_iters, lr_decay_steps=args.lr_decay_iters,
        lr_decay_style=args.lr_decay_style, start_wd=args.weight_decay, end_wd=args.weight_decay,
        wd_incr_steps=tree.schedule.train_iters, wd_incr_style="constant")
