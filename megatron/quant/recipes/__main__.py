from megatron.quant.recipes.cli import main

raise SystemExit(main())
