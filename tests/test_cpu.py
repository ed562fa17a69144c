"""The CPU layer lets megatron-core's GPTModel run forward/backward, alone and at TP=2 over gloo."""
import torch

from megatron.quant import cpu
from tests._dist import run_distributed


def _tiny_gpt_loss(tp: int) -> tuple[float, float]:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    cpu.init_parallel(tensor_model_parallel_size=tp, seed=7)
    config = TransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=128,
        normalization="RMSNorm", gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        add_bias_linear=False, use_cpu_initialization=True, tensor_model_parallel_size=tp,
        attention_dropout=0.0, hidden_dropout=0.0)
    model = GPTModel(config, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=128,
                     max_sequence_length=32, position_embedding_type="rope")
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(16).expand(2, 16)
    loss = model(tokens, positions, None, labels=tokens).mean()
    loss.backward()
    grad_norm = sum(p.grad.double().square().sum() for p in model.parameters() if p.grad is not None)
    return loss.item(), grad_norm.item()


def _tp_worker(rank: int, world_size: int) -> tuple[float, float]:
    return _tiny_gpt_loss(tp=world_size)


def test_gpt_forward_backward_tp1_matches_tp2():
    single = run_distributed(_tp_worker, 1)[0]
    both = run_distributed(_tp_worker, 2)
    # Same master weights (CPU init), same tokens: the loss must not depend on the TP size.
    assert both[0][0] == both[1][0]
    torch.testing.assert_close(both[0][0], single[0], rtol=1e-5, atol=0)


def _rng_worker(rank: int, world_size: int) -> bool:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    cpu.init_parallel(seed=3)
    tracker = get_cuda_rng_tracker()
    before = torch.get_rng_state()
    with tracker.fork():
        first = torch.rand(4)
    with tracker.fork():
        second = torch.rand(4)
    # Forking leaves the default stream untouched and advances the named one.
    return torch.equal(before, torch.get_rng_state()) and not torch.equal(first, second)


def test_rng_tracker_forks_cpu_states():
    assert run_distributed(_rng_worker, 1) == [True]



def test_one_process_world_leaves_launcher_env_alone():
    # Child processes (scripts, torchrun) must not inherit a stale one-process world.
    import os
    import subprocess
    import sys

    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    code = ("import os, torch.distributed as dist; from megatron.quant import cpu; cpu.init_parallel(); "
            f"print(dist.get_world_size(), [k for k in {launcher!r} if k in os.environ])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "1 []"
