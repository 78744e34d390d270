"""The layering of operator/grpo_operator, checked over the import graph (every import, lazy ones included).

    api < rules < render < lifecycle < webhook < controller < cli        (client: beside them, for users)

A module imports only its own layer or lower ones; the pure layers (api, rules, render, lifecycle, webhook.review)
import nothing from kopf, the kubernetes client or aiohttp; there is no import cycle; the trainer imports nothing
from the operator, and the contract between them imports nothing at all. docs/architecture.md explains why.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "grpo_operator"
TRAINER = REPO / "trainer_image" / "grpo_trainer"

RANK = {"api": 0, "rules": 1, "render": 2, "lifecycle": 3, "webhook": 4, "controller": 5, "client": 5, "cli": 6}
PURE = ("grpo_operator.api", "grpo_operator.rules", "grpo_operator.render", "grpo_operator.lifecycle",
        "grpo_operator.webhook.review")
IO_LIBRARIES = {"kopf", "kubernetes", "kubernetes_asyncio", "aiohttp"}
# what a layer may never import, whatever the ranks say
FORBIDDEN = {"client": {"grpo_operator.controller", "grpo_operator.webhook", "grpo_operator.cli", "kopf", "torch"}}


def module_name(path: Path, root: Path, package: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def modules(root: Path, package: str) -> dict[str, Path]:
    return {module_name(p, root, package): p for p in sorted(root.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module `name` imports (grpo_* modules resolved to the file they name; others by their top name)."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.add(alias.name if alias.name.split(".")[0].startswith("grpo_") else alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.split(".")[0].startswith("grpo_"):
                out.add(target.split(".")[0])
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in known else target)
    out.discard("__future__")
    return out


OPERATOR = modules(PACKAGE, "grpo_operator")
KNOWN = set(OPERATOR) | set(modules(TRAINER, "grpo_trainer"))
GRAPH = {name: imports(name, path, KNOWN) for name, path in OPERATOR.items()}


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_nothing_imports_upward(module: str) -> None:
    mine = layer(module)
    if mine not in RANK:
        return  # the package's own __init__
    bad = [t for t in GRAPH[module] if t.startswith("grpo_operator.") and layer(t) != mine
           and RANK.get(layer(t), 99) >= RANK[mine]]
    bad += [t for t in GRAPH[module] for f in FORBIDDEN.get(mine, ()) if t == f or t.startswith(f + ".")]
    assert not bad, f"{module} imports {bad}: a layer may import only lower layers (docs/architecture.md)"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if m.startswith(PURE)))
def test_pure_layers_import_no_io(module: str) -> None:
    bad = sorted(t for t in GRAPH[module] if t in IO_LIBRARIES
                 or (t.startswith("grpo_operator.") and not t.startswith(PURE) and t != "grpo_operator"))
    assert not bad, f"{module} is pure but imports {bad}"


def test_no_import_cycles() -> None:
    internal = {m: {t for t in ts if t in GRAPH and t != m} for m, ts in GRAPH.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(internal[m]):
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                a, b = sorted(set(cycle))[0], sorted(set(cycle))[-1]
                # a package's __init__ and a module of its own naming each other is not a cycle through other code
                if len(set(cycle)) > 2 or not b.startswith(a + "."):
                    raise AssertionError("import cycle: " + " -> ".join(cycle))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(internal):
        if m not in state:
            visit(m)


def test_the_trainer_imports_nothing_from_the_operator_and_the_contract_nothing_at_all() -> None:
    trainer = modules(TRAINER, "grpo_trainer")
    for name, path in trainer.items():
        assert not any(t.startswith("grpo_operator") for t in imports(name, path, KNOWN)), name
    assert imports("grpo_trainer.contract", TRAINER / "contract.py", KNOWN) == set()


def test_the_graph_is_real() -> None:
    """The checks above would pass on an empty graph: make sure they saw the edges they are about."""
    assert "grpo_operator.lifecycle.decision" in GRAPH and "grpo_operator.controller.handlers" in GRAPH
    assert "grpo_operator.lifecycle.decision" in GRAPH["grpo_operator.controller.handlers"] or \
        "grpo_operator.lifecycle" in GRAPH["grpo_operator.controller.handlers"]
    assert "grpo_trainer.contract" in GRAPH["grpo_operator.render.manifests"]
    assert "kopf" in GRAPH["grpo_operator.controller.handlers"]
    assert "grpo_operator.lifecycle.pods" in GRAPH["grpo_operator.lifecycle.decision"]
