"""flambeau._dynamo.backends: the compiler backends a captured graph is handed to.

`registry.py` maps names to `backend(gm, example_inputs) -> callable` (`register_backend`,
`lookup_backend`, `list_backends`); the built-in backends live one module each (`debugging.py`:
"eager", "aot_eager"; `inductor.py`: "inductor") and register themselves when the registry first
imports them, so AOT autograd and the inductor load at the first compile, not with flambeau.
"""
