"""The recipe's models: what a run is, validated before anything starts. Nothing here runs anything.

    base.py       Strict (the shared pydantic settings) and RecipeError
    recipe.py     Recipe: the whole `recipe.yaml`, load_recipe (presets, relative paths, errors)
    presets.py    configs/ presets deep-merged under a recipe before validation
    placement.py  hosts: and placement: (where the arms run, in which order)
    arms.py       arms: and the rule that the arms differ only in the kernel switch (vattn/switch.py)
    server.py     server: (engine flags and env shared by both arms)
    load.py       load: (what aiperf replays)
    accuracy.py   accuracy: (GSM8K / GPQA-diamond tasks); `pipeline eval` builds the same model
    sweep.py      sweep.yaml: a base recipe plus a matrix (or a list) of overlays, expanded into point recipes
    emulator.py   the emulator's own config and command line (model presets, a flag per field), which also
                  reads an emulator recipe's server.args before anything starts

The stages, the runner, the engines, the hosts and the emulator import their spec from here; this
package imports none of them (tests/test_imports.py checks it).
"""
