"""The layering of operator/grpo_operator, checked over the import graph (every import, lazy ones included).

    api < rules < render < lifecycle < webhook < controller < cli        (client: beside them, for users)

A module imports only its own layer or lower ones; the pure layers (api, rules, render, lifecycle, webhook.review)
import nothing from kopf, the kubernetes client or aiohttp; there is no import cycle; the trainer imports nothing
from the operator, and the contract between them imports nothing at all. In render, lifecycle and controller only the
gang schedulers' units (render/gangs, lifecycle/gangs) name a scheduler, each unit is in its side's one table, and
the code map lists their modules. docs/architecture.md explains why.
"""

from __future__ import annotations

import ast
import re
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
    assert "kopf" in GRAPH["grpo_operator.controller.registration"]
    assert "grpo_operator.lifecycle.pods" in GRAPH["grpo_operator.lifecycle.decision"]


# ---- who may name a gang scheduler (docs/architecture.md "Gang schedulers"): in render, lifecycle and controller only
# the schedulers' units and their registries; elsewhere the names are api/gang.py's (checked against the schedulers'
# sources), the API's (api/models.py) and the rules' (rules/validation.py). Docstrings and comments may explain.
SCHEDULER_WORDS = re.compile(r"kueue|volcano|coschedul|scheduler-plugins|podgroup|x-k8s\.io", re.IGNORECASE)
NAMING_SCOPE = ("grpo_operator.render", "grpo_operator.lifecycle", "grpo_operator.controller")
GANG_UNITS = ("grpo_operator.render.gangs", "grpo_operator.lifecycle.gangs")


def scheduler_names(path: Path) -> list[str]:
    """The strings (docstrings aside) and identifiers of a module that name a gang scheduler."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        words: list[str] = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words.append(node.value)
        elif isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words.append(node.name)
        elif isinstance(node, ast.arg):
            words.append(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            words.append(node.arg)
        elif isinstance(node, ast.alias):
            words += [node.name, node.asname or ""]
        found += [f"line {getattr(node, 'lineno', '?')}: {w[:60]!r}" for w in words if SCHEDULER_WORDS.search(w)]
    return found


def in_units(module: str) -> bool:
    return any(module == u or module.startswith(u + ".") for u in GANG_UNITS)


@pytest.mark.parametrize("module", sorted(m for m in OPERATOR if m.startswith(NAMING_SCOPE) and not in_units(m)))
def test_only_the_gang_units_name_a_scheduler(module: str) -> None:
    found = scheduler_names(OPERATOR[module])
    assert not found, (f"{module} names a gang scheduler ({'; '.join(found[:5])}): that belongs in its unit "
                       "(render/gangs, lifecycle/gangs), reached through the registry")
    assert "grpo_operator.api.gang" not in GRAPH[module], f"{module} imports api/gang.py: only the gang units may"


def test_the_scheduler_check_is_real() -> None:
    """It finds the names where they are, and every unit is in its side's one table."""
    for unit in ("grpo_operator.render.gangs.kueue", "grpo_operator.lifecycle.gangs.kueue",
                 "grpo_operator.render.gangs.volcano", "grpo_operator.lifecycle.gangs.coscheduling"):
        assert scheduler_names(OPERATOR[unit]), unit
    from grpo_operator.lifecycle import gangs as lifecycle_gangs
    from grpo_operator.render import gangs as render_gangs

    render_units = {m.rsplit(".", 1)[1] for m in OPERATOR if m.startswith("grpo_operator.render.gangs.")} - {"base", "podgroup"}
    lifecycle_units = {m.rsplit(".", 1)[1] for m in OPERATOR if m.startswith("grpo_operator.lifecycle.gangs.")} - {"base"}
    assert render_units == lifecycle_units == {u.name for u in render_gangs.UNITS} == set(lifecycle_gangs.POLICIES)
    for module in render_units:  # each unit's module holds its own scheduler, on both sides
        assert getattr(render_gangs, module).UNIT.name == module
        assert getattr(lifecycle_gangs, module).__name__.endswith(f".gangs.{module}")


def test_the_code_map_names_every_module_of_the_units() -> None:
    """docs/architecture.md's code map lists each module of the gang units and of server mode."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text[text.index("## Code map"):text.index("**What may import what**")]
    for package in ("render.gangs", "lifecycle.gangs", "lifecycle.server"):
        mods = [m.rsplit(".", 1)[1] for m in OPERATOR if m.startswith(f"grpo_operator.{package}.")]
        assert mods and all(re.search(rf"^\s+{m}\s", block, re.MULTILINE) for m in mods), (package, mods)
