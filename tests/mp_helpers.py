"""Functions that tests/test_multiprocessing.py runs in child processes (importable there without pytest;
`lib` is the library under test: flambeau's torch.multiprocessing or PyTorch's)."""
import os
import sys


def write_rank(i, folder, word):
    with open(os.path.join(folder, f"{i}.txt"), "w") as f:
        f.write(f"{word} {i}")


def fail_on_one(i):
    if i == 1:
        raise ValueError("rank one refuses")


def exit_three_on_one(i):
    if i == 1:
        sys.exit(3)


def sgd_steps(i, model, steps, lib_name):
    import importlib
    lib = importlib.import_module(lib_name)
    opt = lib.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(lib.ones(1, 3)).sum().backward()
        opt.step()
