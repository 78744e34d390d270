"""TRL 1.16's GRPO batch rule (GRPOConfig.__post_init__ + GRPOTrainer's vLLM check), valid values and fixes.

Pure: integers in, verdicts out. Notation (see docs/batch-rule.md): W = nodes × nproc training processes,
P per-device batch, A gradient accumulation, G num_generations, S steps per generation, B generation batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Optional

TRAINING = "spec.training."


@dataclass(frozen=True)
class BatchInput:
    nodes: int
    nproc: int
    per_device: int  # P
    grad_accum: int  # A
    num_generations: int  # G
    steps_per_generation: Optional[int] = None  # S
    generation_batch_size: Optional[int] = None  # B
    eval_on: bool = False  # eval_strategy != "no" (transformers then sets do_eval)
    per_device_eval: int = 8  # Pe
    num_generations_eval: Optional[int] = None  # Ge
    auto_find_batch_size: bool = False
    vllm_mode: str = "colocate"  # colocate | server | none
    tensor_parallel: int = 1
    # Where the per-node process count comes from, for messages: a GPU resource or spec.nprocPerNode.
    nproc_field: str = "spec.nprocPerNode"

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc


@dataclass(frozen=True)
class Fix:
    field: str  # spec path of the knob
    knob: str  # short human name
    current: object
    proposed: object
    also: tuple[Fix, ...] = ()  # further changes that make the whole spec valid together with this one

    def text(self) -> str:
        if self.proposed is None:
            own = f"remove {self.field.rsplit('.', 1)[-1]}"
        elif self.current is None:  # not in the spec (TRL's default applies): say what to add
            own = f"set {self.knob}: {self.proposed}"
        else:
            own = f"{self.knob} {self.current} → {self.proposed}"
        return " and ".join([own] + [f.text() for f in self.also])

    def changes(self) -> tuple[Fix, ...]:
        return (replace(self, also=()),) + self.also


@dataclass(frozen=True)
class Issue:
    code: str  # E0..E6 are TRL's checks; X* are the operator's stricter ones
    field: str
    message: str  # TRL's wording and numbers (or ours for X*), without the fixes
    fixes: tuple[Fix, ...] = ()
    valid_values: Optional[tuple[int, ...]] = None  # valid numGenerations, when that is the question

    def full_message(self) -> str:
        parts = [self.message]
        if self.valid_values is not None:
            parts.append(f"Valid numGenerations for this batch: {', '.join(map(str, self.valid_values))}.")
        if self.fixes:
            parts.append("Smallest fixes (any one): " + "; ".join(f.text() for f in self.fixes) + ".")
        return " ".join(parts)


@dataclass(frozen=True)
class Breakdown:
    world_size: int
    nproc_per_node: int
    generation_batch_size: int
    steps_per_generation: int
    prompts_per_generation: int
    valid_num_generations: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "worldSize": self.world_size,
            "nprocPerNode": self.nproc_per_node,
            "generationBatchSize": self.generation_batch_size,
            "stepsPerGeneration": self.steps_per_generation,
            "promptsPerGeneration": self.prompts_per_generation,
            "validNumGenerations": list(self.valid_num_generations),
        }


@dataclass
class BatchResult:
    issues: list[Issue] = field(default_factory=list)
    breakdown: Optional[Breakdown] = None

    @property
    def ok(self) -> bool:
        return not self.issues


def divisors_at_least_2(n: int) -> tuple[int, ...]:
    if n < 2:
        return ()
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return tuple(d for d in small + large[::-1] if d >= 2)


# Upper bounds no real job reaches (a GPU holds a few hundred sequences at most): a bigger value is a typo, and it
# would make the valid-value search slow.
MAX_SIZE = 4096  # perDeviceTrainBatchSize, perDeviceEvalBatchSize, gradientAccumulationSteps, stepsPerGeneration
MAX_GENERATIONS = 1024  # numGenerations, numGenerationsEval
MAX_GENERATION_BATCH = 1 << 20  # generationBatchSize, and P × W × S


def _sizes(inp: BatchInput) -> list[Issue]:
    """Stricter than TRL: sizes it would happily multiply into nonsense (B = 4 × -1 …), or beyond any GPU."""
    out = []
    bounds = [("perDeviceTrainBatchSize", inp.per_device, MAX_SIZE), ("gradientAccumulationSteps", inp.grad_accum,
              MAX_SIZE), ("stepsPerGeneration", inp.steps_per_generation, MAX_SIZE),
              ("generationBatchSize", inp.generation_batch_size, MAX_GENERATION_BATCH),
              ("perDeviceEvalBatchSize", inp.per_device_eval, MAX_SIZE),
              ("numGenerations", inp.num_generations, MAX_GENERATIONS),
              ("numGenerationsEval", inp.num_generations_eval, MAX_GENERATIONS)]
    for name, value, top in bounds:
        if value is not None and value > top:
            out.append(Issue("X4", TRAINING + name, f"{name} must be at most {top} (got {value}): no GPU trains or "
                             "generates a batch that large.", (Fix(TRAINING + name, name, value, top),)))
    checks = [
        ("perDeviceTrainBatchSize", inp.per_device, True),
        ("gradientAccumulationSteps", inp.grad_accum, True),
        ("stepsPerGeneration", inp.steps_per_generation, inp.steps_per_generation is not None),
        ("generationBatchSize", inp.generation_batch_size, inp.generation_batch_size is not None),
        ("perDeviceEvalBatchSize", inp.per_device_eval, inp.eval_on),
        ("numGenerationsEval", inp.num_generations_eval, inp.num_generations_eval is not None and inp.eval_on),
    ]
    for name, value, applies in checks:
        if applies and value is not None and value < 1:
            out.append(Issue("X1", TRAINING + name, f"{name} must be at least 1 (got {value}).",
                             (Fix(TRAINING + name, name, value, 1),)))
    return out


def derive(inp: BatchInput) -> tuple[Optional[int], Optional[int], list[Issue]]:
    """(B, S, issues) following TRL's order; S None when TRL would raise before computing it (E1, E2: B is then the
    explicit generationBatchSize, still checked against numGenerations)."""
    W, P = inp.world_size, inp.per_device
    B, S = inp.generation_batch_size, inp.steps_per_generation
    issues: list[Issue] = []
    if B is None and S is None:
        S = inp.grad_accum
        B = P * W * S
    elif B is None and S is not None:
        B = P * W * S
    else:
        assert B is not None
        if S is not None:
            # TRL stops here; the explicit generationBatchSize is checked on (E1, E4) so that every error is reported
            issues.append(Issue("E2", TRAINING + "generationBatchSize", "'generation_batch_size' and "
                                "'steps_per_generation' can not be both configured at the same time"))
            S = None
        if P * W == 0 or B % (P * W) != 0:
            issues.append(Issue("E1", TRAINING + "generationBatchSize",
                                f"generation_batch_size ({B}) must be divisible by the global batch size ({P * W})."))
        else:
            S = B // (P * W)
        return B, (None if issues else S), issues
    return B, S, issues


def evaluate(inp: BatchInput) -> tuple[list[Issue], Optional[int], Optional[int]]:
    """All violated rules (without fixes), and B, S when computable."""
    issues = _sizes(inp)
    if inp.nodes < 1 or inp.nproc < 1:
        issues.append(Issue("X2", "spec.nodes" if inp.nodes < 1 else inp.nproc_field,
                            "nodes and processes per node must be at least 1."))
    if not issues and inp.per_device * inp.world_size * (inp.steps_per_generation or inp.grad_accum) > \
            MAX_GENERATION_BATCH:
        issues.append(Issue("X4", TRAINING + "perDeviceTrainBatchSize", "the generation batch (perDeviceTrainBatchSize "
                            f"× world size × steps per generation) must be at most {MAX_GENERATION_BATCH}."))
    if issues:
        return issues, None, None
    W = inp.world_size
    G = inp.num_generations
    if inp.auto_find_batch_size:
        issues.append(Issue("E0", TRAINING + "autoFindBatchSize",
                            "auto_find_batch_size is not supported by GRPO, because the generation batch must contain "
                            "full prompt groups of num_generations completions, and reducing the batch size on "
                            "out-of-memory breaks this invariant. Set auto_find_batch_size=False and lower "
                            "per_device_train_batch_size instead.",
                            (Fix(TRAINING + "autoFindBatchSize", "autoFindBatchSize", True, False),)))
    B, S, derived = derive(inp)
    issues += derived
    if inp.eval_on:
        Ge = inp.num_generations_eval or G
        if Ge < 1 or (inp.per_device_eval * W) % Ge != 0:
            issues.append(Issue("E3", TRAINING + "perDeviceEvalBatchSize",
                                f"The global eval batch size ({inp.per_device_eval} * {W}) must be divisible by the "
                                f"number of generations used for evaluation ({Ge})."))
    if B is not None and G >= 1 and B % G != 0:
        issues.append(Issue("E4", TRAINING + "numGenerations",
                            f"generation_batch_size ({B}) must be divisible by num_generations ({G})."))
    if G < 2:
        issues.append(Issue("E5", TRAINING + "numGenerations",
                            "GRPO requires at least 2 generations per prompt to calculate the advantages. You provided "
                            f"{G}, which is less than the minimum required."))
    if inp.vllm_mode == "colocate":
        tp = inp.tensor_parallel
        if W % tp != 0:
            issues.append(Issue("E6", "spec.vllm.tensorParallelSize",
                                f"tensor_parallel_size ({tp}) must divide world size ({W}) evenly."))
        elif inp.nproc % tp != 0:
            issues.append(Issue("X3", "spec.vllm.tensorParallelSize",
                                f"In colocate mode a vLLM tensor-parallel group must stay inside one node: "
                                f"tensor_parallel_size ({tp}) must divide the processes per node ({inp.nproc})."))
    return issues, B, S


def _with(inp: BatchInput, **changes: int) -> BatchInput:
    """dataclasses.replace without re-running __init__ (the fix search makes thousands of these)."""
    new = object.__new__(BatchInput)
    new.__dict__.update(inp.__dict__)
    new.__dict__.update(changes)
    return new


def _resolves(inp: BatchInput, code: str, before: frozenset[str]) -> bool:
    """After a change: this issue is gone and no new kind of issue appeared (others may remain)."""
    after = {i.code for i in evaluate(inp)[0]}
    return code not in after and after <= before


def _valid_generations(inp: BatchInput, B: int) -> tuple[int, ...]:
    vals = divisors_at_least_2(B)
    if inp.eval_on and not inp.num_generations_eval:
        # G doubles as the eval group size: it must also divide the global eval batch.
        ge = inp.per_device_eval * inp.world_size
        vals = tuple(v for v in vals if ge % v == 0)
    return vals


Candidates = Callable[[int, int, int], Iterator[int]]


def _nearest(inp: BatchInput, attr: str, current: int, candidates_fn: Candidates,
             ok: Callable[[BatchInput], bool], limit: int = 4096) -> list[int]:
    """Closest value(s) of one knob (one below, one above) for which ok(changed input) holds."""
    found: list[int] = []
    for direction in (-1, 1):
        for value in candidates_fn(current, direction, limit):
            if value < 1 or value == current:
                continue
            if ok(_with(inp, **{attr: value})):
                found.append(value)
                break
    found.sort(key=lambda v: (abs(v - current), v))
    return found


def _stepper(step: int) -> Candidates:
    """Candidates current±k·step aligned to multiples of `step` (k = 1, 2, …)."""

    def gen(current: int, direction: int, limit: int) -> Iterator[int]:
        if direction < 0:
            v = (current - 1) // step * step if step > 0 else current - 1
            n = 0
            while v >= 1 and n < limit:
                yield v
                v -= step
                n += 1
        else:
            v = (current // step + 1) * step
            n = 0
            while n < limit:
                yield v
                v += step
                n += 1

    return gen


def _lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


def _num_generations_fix(inp: BatchInput, B: int, ok: Callable[[BatchInput], bool]) -> list[Fix]:
    """The valid numGenerations nearest to the current one (below or above), if any resolves the issue."""
    G = inp.num_generations
    gens = [g for g in _valid_generations(inp, B) if ok(_with(inp, num_generations=g))]
    below = [g for g in gens if g < G]
    above = [g for g in gens if g > G]
    pick = sorted(([below[-1]] if below else []) + ([above[0]] if above else []), key=lambda g: (abs(g - G), g))
    return [Fix(TRAINING + "numGenerations", "numGenerations", G, g) for g in pick[:1]]


def _fixes(inp: BatchInput, issue: Issue, B: Optional[int], S: Optional[int]) -> tuple[Fix, ...]:
    W, P, G = inp.world_size, inp.per_device, inp.num_generations
    fixes: list[Fix] = []
    before = frozenset(i.code for i in evaluate(inp)[0])

    def ok(changed: BatchInput) -> bool:
        return _resolves(changed, issue.code, before)

    def add(attr: str, fld: str, knob: str, current: int, step: int, limit: int = 64) -> None:
        for v in _nearest(inp, attr, current, _stepper(max(step, 1)), ok, limit)[:1]:
            fixes.append(Fix(fld, knob, current, v))

    gpu_knob = "GPUs per node" if inp.nproc_field != "spec.nprocPerNode" else "nprocPerNode"
    if issue.code in ("E4", "E5", "E1") and G >= 1:
        if issue.code in ("E4", "E5") and B is not None:
            fixes += _num_generations_fix(inp, B, ok)
        if issue.code == "E5" and not fixes:  # no batch holds 2 groups as it stands: 2, and the batch fixed after
            fixes.append(Fix(TRAINING + "numGenerations", "numGenerations", G, 2))
        if inp.generation_batch_size is not None:
            step = _lcm(P * W, max(G, 1))
            add("generation_batch_size", TRAINING + "generationBatchSize", "generationBatchSize",
                inp.generation_batch_size, step, 8)
            fixes.append(Fix(TRAINING + "generationBatchSize", "generationBatchSize", inp.generation_batch_size, None))
        G2 = max(G, 2)
        s_eff = S if S is not None else (inp.steps_per_generation or inp.grad_accum)
        add("per_device", TRAINING + "perDeviceTrainBatchSize", "perDeviceTrainBatchSize", P,
            G2 // math.gcd(G2, W * s_eff))
        if inp.generation_batch_size is None:
            if inp.steps_per_generation is not None:
                add("steps_per_generation", TRAINING + "stepsPerGeneration", "stepsPerGeneration",
                    inp.steps_per_generation, G2 // math.gcd(G2, P * W))
            else:
                add("grad_accum", TRAINING + "gradientAccumulationSteps", "gradientAccumulationSteps",
                    inp.grad_accum, G2 // math.gcd(G2, P * W))
        m_w = G2 // math.gcd(G2, P * s_eff) if inp.generation_batch_size is None else 1
        step_n = m_w // math.gcd(m_w, inp.nodes)
        if inp.vllm_mode == "colocate":
            step_n = _lcm(step_n, inp.tensor_parallel)
        add("nproc", inp.nproc_field, gpu_knob, inp.nproc, step_n)
        add("nodes", "spec.nodes", "nodes", inp.nodes, m_w // math.gcd(m_w, inp.nproc))
    elif issue.code == "E2":
        fixes.append(Fix(TRAINING + "stepsPerGeneration", "stepsPerGeneration", inp.steps_per_generation, None))
        fixes.append(Fix(TRAINING + "generationBatchSize", "generationBatchSize", inp.generation_batch_size, None))
    elif issue.code == "E3":
        Ge = inp.num_generations_eval or G
        add("per_device_eval", TRAINING + "perDeviceEvalBatchSize", "perDeviceEvalBatchSize", inp.per_device_eval,
            max(Ge, 1) // math.gcd(max(Ge, 1), W))
        ge_vals = [g for g in divisors_at_least_2(inp.per_device_eval * W)
                   if ok(_with(inp, num_generations_eval=g))]
        if ge_vals:
            best = min(ge_vals, key=lambda g: (abs(g - Ge), g))
            fixes.append(Fix(TRAINING + "numGenerationsEval", "numGenerationsEval", inp.num_generations_eval, best))
    elif issue.code in ("E6", "X3"):
        tps = [t for t in range(1, inp.tensor_parallel) if ok(_with(inp, tensor_parallel=t))]
        if tps:
            fixes.append(Fix("spec.vllm.tensorParallelSize", "tensorParallelSize", inp.tensor_parallel, tps[-1]))
        add("nproc", inp.nproc_field, gpu_knob, inp.nproc, inp.tensor_parallel)
    elif issue.fixes:
        return issue.fixes
    return tuple(fixes)


_TRAINING_ATTRS = {"perDeviceTrainBatchSize": "per_device", "gradientAccumulationSteps": "grad_accum",
                   "numGenerations": "num_generations", "stepsPerGeneration": "steps_per_generation",
                   "generationBatchSize": "generation_batch_size", "perDeviceEvalBatchSize": "per_device_eval",
                   "numGenerationsEval": "num_generations_eval", "autoFindBatchSize": "auto_find_batch_size"}


def _attr(inp: BatchInput, field_path: str) -> str:
    if field_path == "spec.nodes":
        return "nodes"
    if field_path == inp.nproc_field:
        return "nproc"
    if field_path == "spec.vllm.tensorParallelSize":
        return "tensor_parallel"
    return _TRAINING_ATTRS[field_path.removeprefix(TRAINING)]


def apply_fix(inp: BatchInput, fix: Fix) -> BatchInput:
    """The input with every change of the fix made."""
    for change in fix.changes():
        inp = _with(inp, **{_attr(inp, change.field): change.proposed})  # type: ignore[arg-type]
    return inp


def _complete(inp: BatchInput, fix: Fix, depth: int) -> Optional[Fix]:
    """The fix, with the further changes (fixes of the errors left, each on a knob not yet touched) that make the
    whole spec valid: a printed fix, applied alone, always yields a valid spec. None when none is found."""
    changed = apply_fix(inp, fix)
    issues, B, S = evaluate(changed)
    if not issues:
        return fix
    if depth == 0:
        return None
    touched = {c.field for c in fix.changes()}
    for candidate in _fixes(changed, issues[0], B, S)[:3]:  # a narrow search: each level fixes one more error
        if candidate.field in touched:
            continue
        done = _complete(changed, candidate, depth - 1)
        if done is not None:
            return replace(fix, also=fix.also + done.changes())
    return None


def _complete_all(inp: BatchInput, candidates: tuple[Fix, ...], errors: int, limit: int = 4) -> tuple[Fix, ...]:
    out: list[Fix] = []
    for candidate in candidates:
        done = _complete(inp, candidate, min(errors, 5))
        if done is not None and all(done.text() != f.text() for f in out):
            out.append(done)
    out.sort(key=lambda f: len(f.also))  # single changes first
    return tuple(out[:limit])


def check(inp: BatchInput) -> BatchResult:
    issues, B, S = evaluate(inp)
    result = BatchResult()
    if B is not None and S is not None:
        G = inp.num_generations
        result.breakdown = Breakdown(
            world_size=inp.world_size,
            nproc_per_node=inp.nproc,
            generation_batch_size=B,
            steps_per_generation=S,
            prompts_per_generation=B // G if G >= 1 else 0,
            valid_num_generations=_valid_generations(inp, B),
        )
    for issue in issues:
        valid_values = result.breakdown.valid_num_generations if issue.code in ("E4", "E5") and result.breakdown else None
        fixes = _complete_all(inp, _fixes(inp, issue, B, S), len(issues))
        result.issues.append(replace(issue, fixes=fixes, valid_values=valid_values))
    return result
