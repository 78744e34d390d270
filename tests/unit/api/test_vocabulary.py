"""api/status.py is the status vocabulary, defined once: no other module of operator/grpo_operator spells a condition
type or reason itself. Checked over the source (ast): what goes into a condition's or an Event's type and reason
(Condition(...), Draft.set/clear, set_condition/clear_condition, JobEvent(...), and the decisions and failures
that carry a reason to them: StagingDecision, ServerDecision, Failure) is never a string literal, nor a module-level string
constant of another module; and no module outside api/status.py binds a module-level name to one of its strings.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from grpo_operator.api.status import ConditionType, Reason

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "operator" / "grpo_operator"
VOCABULARY = PACKAGE / "api" / "status.py"
SOURCES = [p for p in sorted(PACKAGE.rglob("*.py")) if p != VOCABULARY]
WORDS = {str(v) for v in (*ConditionType, *Reason)}


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def vocabulary_arguments(call: ast.Call) -> list[ast.expr]:
    """The arguments of `call` that become a condition's or an Event's type or reason."""
    name, args = _name(call.func), call.args
    picked: list[ast.expr] = [k.value for k in call.keywords if k.arg in ("type", "ctype", "reason")]
    if name == "Condition":
        return picked
    if name == "set_condition":
        return picked + [a for i, a in enumerate(args) if i in (1, 3)]
    if name == "clear_condition":
        return picked + [a for i, a in enumerate(args) if i in (1, 2)]
    if name == "set" and len(args) >= 4:  # Draft.set(ctype, status, reason, message)
        return picked + [args[0], args[2]]
    if name == "clear" and len(args) == 3:  # Draft.clear(ctype, reason, message)
        return picked + [args[0], args[1]]
    if name in ("JobEvent", "Failure", "StagingDecision", "ServerDecision"):  # (kind/action/retryable, reason, …)
        return picked + args[1:2]
    return []


def module_strings(tree: ast.Module) -> dict[str, str]:
    """A module's module-level names bound to a string literal."""
    out: dict[str, str] = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            out.update({t.id: value.value for t in targets if isinstance(t, ast.Name)})
    return out


def parsed() -> Iterator[tuple[str, ast.Module]]:
    for path in SOURCES:
        yield str(path.relative_to(REPO)), ast.parse(path.read_text(), str(path))


def test_no_module_but_api_status_defines_a_condition_type_or_reason() -> None:
    found = [f"{where}: {name} = {value!r}" for where, tree in parsed()
             for name, value in module_strings(tree).items() if value in WORDS]
    assert not found, "define condition types and reasons in api/status.py (ConditionType, Reason):\n" + "\n".join(found)


def test_conditions_and_events_take_their_type_and_reason_from_api_status() -> None:
    trees = dict(parsed())
    constants = {name for tree in trees.values() for name in module_strings(tree)}
    bad = []
    for where, tree in trees.items():
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            for arg in vocabulary_arguments(call):
                for node in ast.walk(arg):
                    literal = isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value
                    ident = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
                    if literal or isinstance(node, ast.JoinedStr) or ident in constants:
                        bad.append(f"{where}:{call.lineno}: {ast.unparse(arg)}")
                        break
    assert not bad, "a condition type or reason spelled outside api/status.py:\n" + "\n".join(bad)


def test_the_checks_see_what_they_should() -> None:
    """The scan finds a literal and another module's constant, and lets api/status.py's names through."""
    tree = ast.parse('R = "Queued"\ndraft.set(ConditionType.RUNNING, "False", R, m)\n'
                     'JobEvent("Warning", "Oops", m)\nStagingDecision(Action.WAIT, Reason.STAGING, m)\n')
    assert module_strings(tree) == {"R": "Queued"} and "Queued" in WORDS
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert [ast.unparse(a) for c in calls for a in vocabulary_arguments(c)] == \
        ["ConditionType.RUNNING", "R", "'Oops'", "Reason.STAGING"]
