"""The lab: studies and sweeps of whole training runs (plans, sizing, the corpus, the ledger), run as
processes of the trainer (``megatron.quant.training``) and compared by ``megatron.quant.analysis``."""
