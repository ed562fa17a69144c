"""``python -m megatron.quant.training``: pretrain Llama on megatron-core (``training.main``)."""
from megatron.quant.training.main import main

main()
