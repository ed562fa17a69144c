"""Megatron-LM's own loop takes the lab's layers: the spec loaded by module and name as pretrain_gpt.py loads it
(megatron-core's import_module), forward_backward_func from megatron-core, and the iteration counter driven as
Megatron-LM's train() drives it, with one call (megatron_lm_spec.step) at each iteration's start.

megatron-core's schedules are CUDA-only (they place their token count on "cuda"); on CPU the loop runs
``_cpu_forward_backward``, which does what ``forward_backward_no_pipelining`` does with the same arguments."""
import json
from functools import partial

import pytest
import torch

from megatron.quant.training import megatron_lm_spec
from megatron.quant.training.model import transformer_config
from megatron.quant.training.presets import get_preset
from megatron.quant.training.variables import VARIABLES

SEQ, MICRO, MICROBATCHES, VOCAB = 16, 2, 2, 512


@pytest.fixture
def parallel(monkeypatch):
    from megatron.quant.cpu import destroy_parallel, init_parallel

    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    init_parallel(1, 1, seed=1234)
    yield monkeypatch
    destroy_parallel()


def _gpt_builder(config, spec):
    """gpt_builders.gpt_builder's GPTModel call for a Llama shape (Megatron-LM core_v0.19.0)."""
    from megatron.core.models.gpt import GPTModel

    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                    pre_process=True, post_process=True, parallel_output=True,
                    share_embeddings_and_output_weights=True, position_embedding_type="rope")


def _forward_step(data_iterator, model):
    """pretrain_gpt.py's forward_step: the batch, the model's per-token losses, and the loss function."""
    tokens = next(data_iterator)
    position_ids = torch.arange(SEQ, device=tokens.device).expand_as(tokens)
    losses = model(tokens, position_ids, None, labels=torch.roll(tokens, -1, dims=1))
    mask = torch.ones_like(tokens, dtype=torch.float)

    def loss_func(output):
        total = (output.float() * mask).sum()
        return total, mask.sum().to(torch.int), {"lm loss": torch.stack([total.detach(), mask.sum()])}
    return losses, partial(loss_func)


def _cpu_forward_backward(*, forward_step_func, data_iterator, model, num_microbatches, seq_length,
                          micro_batch_size, forward_only):
    """forward_backward_no_pipelining's work for one model chunk: each micro-batch's forward step, its loss
    (per-token mean) over the micro-batches, backward; the loss reports in order."""
    reports = []
    for _ in range(num_microbatches):
        output, loss_func = forward_step_func(data_iterator, model[0])
        total, tokens, report = loss_func(output)
        if not forward_only:
            (total / tokens / num_microbatches).backward()
        reports.append(report)
    return reports


@pytest.mark.slow
def test_a_megatron_lm_loop_trains_llama_tiny_quantized_and_captures_the_right_iterations(parallel, tmp_path):
    """llama-tiny, three iterations of two micro-batches under mxfp8; capture of iteration 2 only."""
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.spec_utils import import_module

    for key, value in {"CUSTOM_QUANT_TYPE": "mxfp8", "TENSOR_SAVE_ENABLED": "1", "TENSOR_SAVE_DIR": str(tmp_path),
                       "TENSOR_SAVER_ITERATION": "2", "TENSOR_SAVE_LAYERS": "0", "TENSOR_SAVE_ROLES": "fc1"}.items():
        parallel.setenv(key, value)
    shape = dict(get_preset("llama-tiny"), seq_length=SEQ)
    config = transformer_config(shape)
    spec = import_module(("megatron.quant.training.megatron_lm_spec", "dense"))  # --spec MODULE NAME
    model = _gpt_builder(config, spec)
    cuda = torch.cuda.is_available()
    forward_backward_func = get_forward_backward_func() if cuda else _cpu_forward_backward
    data = torch.randint(0, VOCAB, (3 * MICROBATCHES, MICRO, SEQ), generator=torch.Generator().manual_seed(0))
    model, data = (model.cuda(), data.cuda()) if cuda else (model, data)
    fc1 = model.decoder.layers[0].mlp.linear_fc1
    assert fc1.quant is None  # Megatron-LM's config carries no lab precision: stock until step binds it
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_iters, iteration, losses = 3, 0, []
    while iteration < train_iters:  # Megatron-LM's train(): train_step, then iteration += 1
        megatron_lm_spec.step([model], iteration, train_iters=train_iters, seed=1234)
        optimizer.zero_grad()
        reports = forward_backward_func(
            forward_step_func=_forward_step, data_iterator=iter(data[iteration * MICROBATCHES:]), model=[model],
            num_microbatches=MICROBATCHES, seq_length=SEQ, micro_batch_size=MICRO, forward_only=False)
        optimizer.step()
        iteration += 1
        losses.append(sum(float(r["lm loss"][0]) for r in reports) / sum(float(r["lm loss"][1]) for r in reports))
    from megatron.quant import tensor_saver

    tensor_saver.close()
    assert all(loss == loss for loss in losses) and losses[-1] < losses[0]
    assert fc1.quant["fprop.input"].fmt.name.startswith("mxfp8")  # step bound the recipe: quantized, not stock
    records = [json.loads(line)["metadata"] for line in (tmp_path / "mxfp8").glob("manifest-rank*.jsonl")
               .__next__().open()]
    assert {r["iteration"] for r in records} == {2}
    assert {r["module"] for r in records} == {"decoder.layers.0.mlp.linear_fc1"}


def test_the_moe_spec_and_a_precision_file_reach_every_expert(parallel, tmp_path):
    """--spec ... moe builds megatron-core's MoE layers from the lab's modules; step binds a per-module precision
    file (Megatron-LM's --te-precision-config-file) to them, experts included."""
    from megatron.core.transformer.spec_utils import import_module

    from megatron.quant.training.moe import moe_config_fields

    precision = tmp_path / "experts.yaml"
    precision.write_text("configs:\n  experts: mxfp4\n  rest: bf16\nmatchers:\n"
                         "  experts: {type: glob, pattern: '*experts*', config: experts, enabled: true}\n"
                         "  rest: {type: glob, pattern: '*', config: rest, enabled: true}\n")
    shape = dict(get_preset("llama-moe-tiny"), seq_length=SEQ)
    config = transformer_config(shape, moe_run=dict(router_dtype="fp32"))
    assert config.num_moe_experts == moe_config_fields(shape)["num_moe_experts"] == 4
    model = _gpt_builder(config, import_module(("megatron.quant.training.megatron_lm_spec", "moe")))
    megatron_lm_spec.step(model, 0, train_iters=1, seed=0, precision_file=str(precision))
    mlp = model.decoder.layers[1].mlp
    experts = [expert.linear_fc1.quant["fprop.input"].fmt for expert in mlp.experts.local_experts]
    assert len(experts) == 4 and all(fmt.name == "mxfp4_e2m1" for fmt in experts)
    assert model.decoder.layers[1].self_attention.linear_qkv.quant["fprop.input"].fmt is None  # bf16: unquantized
    from megatron.quant import tensor_saver

    tensor_saver.close()


def test_spec_for_follows_the_layer_pattern_and_step_refuses_a_model_it_cannot_bind(parallel):
    shape = dict(get_preset("llama-moe-tiny"), seq_length=SEQ, moe_layer_freq=[0, 1])
    spec = megatron_lm_spec.spec_for(transformer_config(shape))
    assert [layer.submodules.mlp.module.__name__ for layer in spec.layer_specs] == ["MLP", "MoELayer"]
    with pytest.raises(TypeError, match="expected a GPTModel"):
        megatron_lm_spec.step(torch.nn.Linear(2, 2), 0, train_iters=1, seed=0)
