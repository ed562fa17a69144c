"""A feature of one's own for nvdlfw-inspect configs, as docs/capture.md ("Features of your own") writes it:
a class with ``translate`` in the ``INSPECT_FEATURES`` of an importable module."""
from megatron.quant.recipes.rules import FormatChoice
from megatron.quant.tensor_saver import InspectConfigError, Translation, operand_items


class HiFloat8Gradients:
    """The listed GEMMs' gradient operands in HiFloat8 (``tensors`` defaults to the gradient)."""

    def translate(self, options, where):
        options = {"tensors": ["gradient"], **options}
        items = operand_items(options, ("rounding",), "HiFloat8Gradients", where)
        rounding = {opts.get("rounding", "nearest") for _, _, opts in items}
        if not rounding <= {"nearest", "stochastic"}:
            raise InspectConfigError(f"{where}: rounding {sorted(rounding)}: allowed: nearest, stochastic")
        return Translation("HiFloat8Gradients", tuple(
            (key, FormatChoice("hifp8", (("rounding", opts.get("rounding", "nearest")),))) for _, key, opts in items))


INSPECT_FEATURES = {"HiFloat8Gradients": HiFloat8Gradients()}
