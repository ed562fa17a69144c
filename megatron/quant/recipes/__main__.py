from megatron.quant import notices

notices.hide_known()  # `show` imports megatron-core: its known start-up notices stay off the console

from megatron.quant.recipes.cli import main  # noqa: E402

raise SystemExit(main())
