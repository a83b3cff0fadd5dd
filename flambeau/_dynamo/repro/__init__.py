"""The minifier (PyTorch's `TORCHDYNAMO_REPRO_AFTER` / `TORCHDYNAMO_REPRO_LEVEL`).

    FLAMBEAU_REPRO_AFTER=aot FLAMBEAU_REPRO_LEVEL=2 python train.py

`repro_after` picks where a compiled graph is watched: "dynamo" (the captured graph given to the
backend, after_dynamo.py) or "aot" (each forward/backward graph given to the inductor compiler,
after_aot.py). `repro_level`: 1 writes a repro script of a failing graph; 2 (the default) minifies
a graph that raises and writes the minimal script; 3 also writes `minifier_launcher.py` of every
graph before compiling it (for crashes); 4 minifies a graph whose compiled output differs from
eager beyond `repro_tolerance`, judged against float64 (PyTorch's `same()`).

Scripts go to `./flambeau_compile_debug/minifier/` (or `config.minifier_dir`,
`$FLAMBEAU_MINIFIER_DIR`): `repro.py` rebuilds the graph with random inputs of the recorded
shapes, strides and dtypes and fails the same way under `python repro.py`. The pieces:
fx_minifier.py (delta debugging over an FX graph), failure.py (the failure test, what each level
writes), script.py (writing scripts and compiling their graphs), runner.py (what a script runs),
debug_utils.py (inputs, `same`).
"""
from .debug_utils import AccuracyError, make_inputs, rand_strided, same  # noqa: F401
from .fx_minifier import minify  # noqa: F401
from .runner import run_repro  # noqa: F401
