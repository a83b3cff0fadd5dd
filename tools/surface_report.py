"""Which `torch.*` names real code uses, and which of them flambeau has at PyTorch's path.

    python tools/surface_report.py DIR [DIR ...] [--missing-only] [--no-torch-check]

Each DIR is one project (a checkout of a public PyTorch program, never committed here). Every
`.py` file under it (and the code cells of `.ipynb` notebooks) is read with `ast`: `import torch.x`,
`from torch.x import y`, and attribute chains rooted at a name bound to a torch module
(`torch.backends.cuda.matmul.allow_tf32`, `F.cross_entropy` after `import torch.nn.functional as F`).
Each dotted name is then looked up in flambeau (the longest importable module prefix, then
attributes) and, unless `--no-torch-check`, in PyTorch too, so a name PyTorch itself lacks (an old
API) is reported apart instead of as missing. Prints per project: names used, covered, missing.
Exit status 1 when any name PyTorch has is missing from flambeau.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import json
import pathlib
import sys

ROOT = "torch"


def _notebook_source(path: pathlib.Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    lines = []
    for cell in cells:
        if cell.get("cell_type") != "code":
            continue
        src = "".join(cell.get("source", []))
        lines.extend(line for line in src.splitlines() if not line.lstrip().startswith(("!", "%")))
    return "\n".join(lines)


def _dotted(node: ast.AST) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"]; None when the chain does not start at a plain name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


class _Scanner(ast.NodeVisitor):
    """Collects the full dotted torch names a module uses."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        self.names: set[str] = set()

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == ROOT or alias.name.startswith(ROOT + "."):
                self.names.add(alias.name)
                if alias.asname:
                    self.aliases[alias.asname] = alias.name
                else:
                    self.aliases[ROOT] = ROOT

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return
        if node.module != ROOT and not node.module.startswith(ROOT + "."):
            return
        self.names.add(node.module)
        for alias in node.names:
            if alias.name == "*":
                continue
            full = f"{node.module}.{alias.name}"
            self.names.add(full)
            self.aliases[alias.asname or alias.name] = full

    def visit_Attribute(self, node: ast.Attribute) -> None:
        parts = _dotted(node)
        if parts is not None and parts[0] in self.aliases:
            self.names.add(".".join([self.aliases[parts[0]]] + parts[1:]))
            return
        self.generic_visit(node)


def scan_project(root: pathlib.Path) -> dict[str, set[str]]:
    """Dotted torch name -> the files (relative to `root`) that use it."""
    used: dict[str, set[str]] = {}
    files = sorted(list(root.rglob("*.py")) + list(root.rglob("*.ipynb")))
    for path in files:
        try:
            text = _notebook_source(path) if path.suffix == ".ipynb" else path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        scanner = _Scanner()
        scanner.visit(tree)
        for name in scanner.names:
            used.setdefault(name, set()).add(str(path.relative_to(root)))
    return used


def resolve(name: str, package: str) -> bool:
    """Whether dotted `name` (spelled from `torch`) exists under `package` at the same path."""
    parts = name.split(".")
    parts[0] = package
    obj = None
    depth = len(parts)
    while depth:
        try:
            obj = importlib.import_module(".".join(parts[:depth]))
            break
        except ImportError:
            depth -= 1
        except Exception:  # noqa: BLE001  a module that fails on import is missing for the user
            return False
    if obj is None:
        return False
    for attr in parts[depth:]:
        try:
            obj = getattr(obj, attr)
        except Exception:  # noqa: BLE001  any failure to produce the attribute counts as missing
            return False
    return True


def report(projects: list[pathlib.Path], missing_only: bool, torch_check: bool) -> int:
    import flambeau  # noqa: F401  (the system under test, imported after argument parsing)
    missing_total = 0
    for root in projects:
        used = scan_project(root)
        covered, missing, not_in_torch = [], [], []
        for name in sorted(used):
            if resolve(name, "flambeau"):
                covered.append(name)
            elif torch_check and not resolve(name, "torch"):
                not_in_torch.append(name)
            else:
                missing.append(name)
        missing_total += len(missing)
        print(f"== {root.name}: {len(used)} names, {len(covered)} covered, {len(missing)} missing"
              + (f", {len(not_in_torch)} not in this PyTorch" if not_in_torch else ""))
        if not missing_only:
            for name in covered:
                print(f"   ok       {name}")
        for name in missing:
            print(f"   MISSING  {name}   ({', '.join(sorted(used[name])[:3])})")
        for name in not_in_torch:
            print(f"   (torch?) {name}")
    return 1 if missing_total else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("projects", nargs="+", type=pathlib.Path)
    parser.add_argument("--missing-only", action="store_true")
    parser.add_argument("--no-torch-check", action="store_true")
    args = parser.parse_args(argv)
    return report(args.projects, args.missing_only, not args.no_torch_check)


if __name__ == "__main__":
    sys.exit(main())
