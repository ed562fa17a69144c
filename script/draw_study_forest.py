#!/usr/bin/env python
"""Draw the study's forest plot from a saved recipe table (a runs report's recipes.csv), e.g. the
README's figure from the committed table:

    python script/draw_study_forest.py docs/study/study_150_recipes.csv docs/study/study_150_forest.png

``--anchors docs/study/quartet2_anchors.csv`` adds published gaps (Quartet-II's released runs) as
anchor rows beside ours.
"""
import argparse
import sys
from pathlib import Path

from megatron.quant.analysis.runs.forest import draw_from_csv


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipes_csv", type=Path, help="the recipe table (recipes.csv of a runs report)")
    parser.add_argument("png", type=Path, help="where the figure goes")
    parser.add_argument("--baseline", default="bf16", help="the baseline recipe (default: %(default)s)")
    parser.add_argument("--anchors", type=Path, default=None,
                        help="published gaps to draw beside ours (docs/study/quartet2_anchors.csv)")
    args = parser.parse_args()
    if not args.recipes_csv.is_file():
        parser.error(f"no recipe table at {str(args.recipes_csv)!r}")
    try:
        drawn = draw_from_csv(args.recipes_csv, args.png, args.baseline, anchors=args.anchors)
    except (OSError, ValueError, KeyError) as problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if not drawn.drawn:
        print(f"error: {args.png}: {drawn.error}", file=sys.stderr)
        return 1
    if drawn.warning():
        print(f"warning: {args.png} may hide something: {drawn.warning()}", file=sys.stderr)
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
