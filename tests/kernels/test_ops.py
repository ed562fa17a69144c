"""The kernels as torch operators (``kernels.ops``): ``torch.compile`` traces a quantized linear through
them in one graph, without a break, and the compiled result has the eager kernels' bits; each
operator's fake implementation gives the shapes and dtypes of its real outputs."""
import pytest
import torch

from megatron.quant.formats import get_format
from megatron.quant.formats.random_bits import RandomBits
from tests.kernels._compare import assert_same_bits, triton_twin, wide_values

pytestmark = pytest.mark.device
NOISE = RandomBits.derive("ops", 1)


def _quantized_linear(fmt):
    def linear(x, w):
        qx, sx = fmt.quantize_for_gemm(x, -1, noise=NOISE)
        qw, sw = fmt.quantize_for_gemm(w, -1)
        out = qx @ qw.T
        return out if sx is None else out * (sx * sw)
    return linear


@pytest.mark.parametrize("name, options", [("nvfp4", {"rounding": "stochastic"}), ("fp8_e4m3", {})])
def test_a_quantized_linear_compiles_through_the_kernel_operators_in_one_graph(name, options, kernel_device):
    twin = triton_twin(get_format(name, **options))
    linear = _quantized_linear(twin)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(linear, fullgraph=True, backend=backend)  # fullgraph: a break raises
    x = wide_values((32, 64), seed=1, device=kernel_device, lo=-8, hi=8, specials=False)
    w = wide_values((48, 64), seed=2, device=kernel_device, lo=-8, hi=8, specials=False)
    assert_same_bits(compiled(x, w), linear(x, w), name)
    called = {str(node.target) for node in graphs[0].graph.nodes if node.op == "call_function"}
    assert any(target.startswith("megatron_quant.") for target in called), called


def test_the_fake_implementations_give_the_real_outputs_shapes(kernel_device):
    from megatron.quant.kernels import ops

    for name, options in (("nvfp6", {}), ("fp8_e4m3", {"scaling": "none"})):
        contract = get_format(name, **options).kernel_contract
        x = wide_values((16, 64), seed=3, device=kernel_device, specials=False)
        for stats in (0, 2):
            if contract.blocked:  # the tensor scale from x's own amax with stats, from given rows without
                tensor = None if stats else torch.ones(4, 1, device=kernel_device)
                args = (x, tensor, [0, 0, 1, 1, 0, 1], contract.to_json(), 1, False, stats, None, torch.bfloat16,
                        tensor is None)
                op = ops.quantize_blocks
            else:
                args = (x, None, None, [0, 0, 1, 1, 0, 1], contract.to_json(), torch.bfloat16, stats)
                op = ops.quantize_elementwise
            torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
    contract = get_format("fp8_e4m3").kernel_contract.to_json()
    for amax, take_amax in ((None, False), (torch.tensor(3.0, device=kernel_device), True)):
        args = (x, amax, [0, 0, 1, 1, 0, 1], contract, torch.bfloat16, True, take_amax)
        torch.library.opcheck(ops.quantize_elementwise_tensor_scaled, args,
                              test_utils=("test_schema", "test_faketensor"))
