"""The vocabulary of settings that recipes, capture and training share: the on/off words and the
refusal of misspelt variables (``switches``), the index-selector grammar of layers, ranks,
microbatches and iterations (``selectors``), the recipe-name rule (``names``), the variables'
names (``variables``) and their one reader (``environment``).

At the bottom of the house beside ``yaml_safe``: it imports nothing of ours, so every room that
reads a setting can see it.
"""
