"""docs/scheduling.md shows what the operator renders per mode: every `# mode: …` YAML block there must be a subset
of what render() makes of examples/multi-node.yaml under that mode."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_operator.api import gang as g
from grpo_operator.render import manifests
from grpo_operator.render.gangs import kueue
from grpo_operator.rules import validation

REPO = Path(__file__).resolve().parents[3]
DOC = (REPO / "docs" / "scheduling.md").read_text()
BLOCKS = re.findall(r"```yaml\n# mode: (\w+), (attempt|object): (\w+)\n(.*?)```", DOC, re.S)
UID = "5f0c6a1e-0000-4000-8000-000000000000"


def subset(part: Any, whole: Any, path: str = "") -> list[str]:
    """Where `part` is not contained in `whole` (dicts by key, lists item by item)."""
    if isinstance(part, dict):
        if not isinstance(whole, dict):
            return [path]
        return [p for k, v in part.items() for p in (subset(v, whole[k], f"{path}.{k}") if k in whole else [f"{path}.{k}"])]
    if isinstance(part, list):
        if not isinstance(whole, list) or len(part) != len(whole):
            return [path]
        return [p for i, (a, b) in enumerate(zip(part, whole, strict=False)) for p in subset(a, b, f"{path}[{i}]")]
    return [] if part == whole else [f"{path}: {part!r} != {whole!r}"]


def rendered(mode: str, attempt: int) -> list[dict[str, Any]]:
    doc = yaml.safe_load((REPO / "examples" / "multi-node.yaml").read_text())
    if mode != "kueue":
        del doc["metadata"]["labels"][g.KUEUE_QUEUE_LABEL]
        doc["spec"]["scheduling"] = {"gang": mode, **({"scheduleTimeoutSeconds": 600} if mode == "coscheduling"
                                                      else {"queue": "research"})}
    res = validation.validate(doc)
    assert res.valid, res.summary()
    return manifests.core_objects(res.job, res.topology, "team-a", uid=UID, attempt=attempt,
                            groups={"trainer": kueue.group_name("qwen7b-math", UID, 0)} if mode == "kueue" else None)


def test_the_docs_have_a_block_per_mode() -> None:
    assert {m for m, *_ in BLOCKS} == {"kueue", "coscheduling", "volcano"} and len(BLOCKS) == 6


@pytest.mark.parametrize("mode, kind, which, text", BLOCKS, ids=[f"{m}-{w}" for m, _, w, _ in BLOCKS])
def test_block_matches_the_renderer(mode: str, kind: str, which: str, text: str) -> None:
    part = yaml.safe_load(text)
    objs = rendered(mode, int(which) if kind == "attempt" else 0)
    want = "Pod" if kind == "attempt" else which
    obj = next(o for o in objs if o["kind"] == want)  # the first: the PodGroup, or the pod of rank 0
    assert subset(part, obj) == []
