"""The release artifacts, built here as .github/workflows/release.yml builds them: the sdist, the wheel built from that
sdist (so the sdist is complete), the chart package (helm 3 and 4); the wheel installed into a clean venv, whose
commands then run. Versions: scripts/version.py (pyproject.toml is the one source) agrees with every copy.

The clean venv: `python -m venv --without-pip`, the wheel installed with `pip --python <venv> install --no-deps
--no-index` (offline), and its declared dependencies (the wheel's own Requires-Dist, without extras, and theirs,
recursively) linked in from this test's environment, nothing else. So a command that imports something the package
does not declare (torch, trl, a test helper) fails here as it would after `pip install grpo-operator`; the only
difference from pip's resolver is that the versions are the ones installed here, not the newest allowed.
"""

from __future__ import annotations

import email
import importlib.metadata as md
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.cluster.kubectl import kubectl_path
from tests.support.helm import CHART, HELMS, REPO, helm

_spec = importlib.util.spec_from_file_location("release_version", REPO / "scripts" / "version.py")
assert _spec and _spec.loader
version_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(version_script)
VERSION = version_script.current()
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)  # type: ignore[call-overload]
    assert cp.returncode == 0, f"{' '.join(map(str, argv))} failed ({cp.returncode}):\n{cp.stdout[-3000:]}\n{cp.stderr[-3000:]}"
    return cp


# ------------------------------------------------------------------------------------------ versions
def test_one_version_everywhere() -> None:
    """pyproject.toml, Chart.yaml version/appVersion, the default image tags, the docs' and examples' pins."""
    assert version_script.mismatches(VERSION) == []
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == VERSION


def test_set_version_rewrites_every_copy_and_check_catches_a_stale_one(tmp_path: Path) -> None:
    for path, _ in [version_script.SOURCE, *version_script.COPIES]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, tmp_path / path)
    version_script.set_version("9.8.7", tmp_path)
    assert version_script.current(tmp_path) == "9.8.7" and version_script.mismatches("9.8.7", tmp_path) == []
    chart = tmp_path / "charts/grpo-operator/Chart.yaml"
    chart.write_text(chart.read_text().replace('appVersion: "9.8.7"', 'appVersion: "9.8.6"'))
    assert [m.split(":")[0] for m in version_script.mismatches("9.8.7", tmp_path)] == ["charts/grpo-operator/Chart.yaml"]
    cp = subprocess.run([sys.executable, str(REPO / "scripts" / "version.py"), "--check", "0.0.1"], capture_output=True,
                        text=True, timeout=60)
    assert cp.returncode == 1 and "Chart.yaml" in cp.stderr and "want 0.0.1" in cp.stderr


# ------------------------------------------------------------------------------------------ the workflow
def test_release_workflow_passes_actionlint_and_publishes_what_the_docs_say() -> None:
    exe = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))
    assert exe, "actionlint is not installed: rerun scripts/setup.sh (pyproject.toml's test extra)"
    cp = subprocess.run([exe, "-no-color", str(WORKFLOW)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    flow = yaml.safe_load(WORKFLOW.read_text())
    steps = {job: "\n".join(str(s.get("run", "")) + str(s.get("uses", "")) for s in spec["steps"])
             for job, spec in flow["jobs"].items()}
    assert "scripts/version.py --check" in steps["versions"]
    assert all("versions" in flow["jobs"][j]["needs"] for j in ("python", "chart"))
    assert "python -m build" in steps["python"] and "pypa/gh-action-pypi-publish" in steps["pypi"]
    assert flow["jobs"]["pypi"]["permissions"] == {"id-token": "write"}  # trusted publishing, no stored token
    assert "helm package charts/grpo-operator" in steps["chart"] and 'oci://ghcr.io/$owner/charts"' in steps["chart"]
    install = (REPO / "docs" / "install.md").read_text()
    assert f"oci://ghcr.io/grpo-operator/charts/grpo-operator --version {VERSION}" in install
    assert f"pip install grpo-operator=={VERSION}" in install


# ------------------------------------------------------------------------------------------ Python package
def _source_tree(dest: Path) -> Path:
    """What a checkout holds: git's tracked files plus new ones it does not ignore (no build/, .venv, caches)."""
    files = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO).stdout.split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def _backend(hook: str, source: Path, out: Path) -> Path:
    """A PEP 517 hook of the project's build backend (setuptools), as `python -m build --no-isolation` calls it."""
    code = f"from setuptools import build_meta as b; print(b.{hook}({str(out)!r}))"
    name = run([sys.executable, "-c", code], cwd=source, env={**os.environ, "PYTHONPATH": ""}).stdout.split()[-1]
    return out / name


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("dist")
    out = tmp / "dist"
    out.mkdir()
    sdist = _backend("build_sdist", _source_tree(tmp / "src"), out)
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp / "unpacked", filter="data")
    (root,) = (tmp / "unpacked").iterdir()
    return {"sdist": sdist, "wheel": _backend("build_wheel", root, out)}


def test_sdist_and_wheel_carry_the_package(dists: dict[str, Path]) -> None:
    assert dists["sdist"].name == f"grpo_operator-{VERSION}.tar.gz"
    assert dists["wheel"].name == f"grpo_operator-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(dists["wheel"]) as whl:
        names = set(whl.namelist())
        info = f"grpo_operator-{VERSION}.dist-info"
        meta = email.message_from_string(whl.read(f"{info}/METADATA").decode())
        entry_points = whl.read(f"{info}/entry_points.txt").decode()
    assert meta["Name"] == "grpo-operator" and meta["Version"] == VERSION
    for script in ("grpojob = grpo_operator.cli.grpojob:main", "kubectl-grpo = grpo_operator.cli.kubectl_grpo:main",
                   "grpo-operator = grpo_operator.cli.grpo_operator:main"):
        assert script in entry_points
    assert "grpo_operator/client/__init__.py" in names and "grpo_operator/cli/kubectl_grpo.py" in names
    assert any(n.startswith("grpo_operator/api/data/") for n in names), "package data (api/data) missing"
    assert not any(n.startswith(("tests/", "charts/", "bench/")) for n in names)


def _declared(requires: list[str]) -> dict[str, md.Distribution]:
    """The distributions a requirement list pulls in (no extras), recursively, as installed here."""
    seen: dict[str, md.Distribution] = {}
    todo = list(requires)
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        key = canonicalize_name(req.name)
        if key in seen:
            continue
        dist = md.distribution(req.name)
        assert dist.version in req.specifier or not req.specifier, f"{req}: {dist.version} installed here"
        seen[key] = dist
        todo += dist.requires or []
    return seen


@pytest.fixture(scope="module")
def venv(dists: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("clean") / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(root)])
    py = root / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
         str(dists["wheel"])])
    site = Path(run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    env={"PATH": "/usr/bin:/bin"}).stdout.strip())
    with zipfile.ZipFile(dists["wheel"]) as whl:
        meta = email.message_from_string(whl.read(f"grpo_operator-{VERSION}.dist-info/METADATA").decode())
    for dist in _declared(meta.get_all("Requires-Dist") or []).values():
        for file in dist.files or []:
            top = file.parts[0]
            if top == ".." or (site / top).exists() or top.endswith(".pth"):
                continue  # console scripts (outside site-packages); already linked
            (site / top).symlink_to(Path(dist.locate_file(top)))
    return root


@pytest.fixture
def clean_env(venv: Path, tmp_path: Path) -> Iterator[dict[str, str]]:
    # no PYTHONPATH (it points at the checkout), the venv's bin first, kubectl for its plugin lookup
    yield {"PATH": f"{venv / 'bin'}:{kubectl_path().parent}:/usr/bin:/bin", "HOME": str(tmp_path),
           "KUBECONFIG": str(tmp_path / "none")}


def test_the_wheel_runs_in_a_clean_venv(venv: Path, clean_env: dict[str, str], tmp_path: Path) -> None:
    """`grpojob check`, `kubectl grpo --help`, `grpo-operator --help` and the client, from the installed wheel only."""
    bin_ = venv / "bin"
    where = run([str(bin_ / "python"), "-c", "import grpo_operator.client, grpo_operator; print(grpo_operator.__file__)"],
                env=clean_env, cwd=tmp_path).stdout
    assert where.startswith(str(venv)), where  # the wheel's code, not the checkout's
    # the venv sees the declared dependencies only: the trainer's stack (installed here) is not there
    assert subprocess.run([str(bin_ / "python"), "-c", "import trl"], env=clean_env, capture_output=True,
                          timeout=60).returncode != 0
    for example in ("minimal.yaml", "multi-node.yaml", "invalid-batch.yaml"):
        shutil.copy(REPO / "examples" / example, tmp_path / example)
    ok = run([str(bin_ / "grpojob"), "check", "minimal.yaml", "multi-node.yaml"], env=clean_env, cwd=tmp_path)
    assert "minimal.yaml" in ok.stdout
    bad = subprocess.run([str(bin_ / "grpojob"), "check", "invalid-batch.yaml"], env=clean_env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "Traceback" not in bad.stdout + bad.stderr, bad.stdout + bad.stderr
    plugin = run([str(kubectl_path()), "grpo", "--help"], env=clean_env, cwd=tmp_path)  # kubectl finds kubectl-grpo
    assert "Submit, watch and steer GRPOJobs" in plugin.stdout
    run([str(bin_ / "grpo-operator"), "--help"], env=clean_env, cwd=tmp_path)


# ------------------------------------------------------------------------------------------ chart package
@pytest.mark.parametrize("helm_bin", HELMS)
def test_chart_package(helm_bin: str, tmp_path: Path) -> None:
    """`helm package` as the workflow runs it: the versioned archive `helm push` sends to oci://…/charts, whole."""
    helm(helm_bin, "package", str(CHART), "--destination", str(tmp_path))
    tgz = tmp_path / f"grpo-operator-{VERSION}.tgz"
    assert tgz.exists(), list(tmp_path.iterdir())
    shown = yaml.safe_load(helm(helm_bin, "show", "chart", str(tgz)).stdout)
    assert shown["version"] == shown["appVersion"] == VERSION and shown["kubeVersion"] == ">=1.20.0-0"
    with tarfile.open(tgz) as tar:
        names = set(tar.getnames())
    for f in ("Chart.yaml", "values.yaml", "values.schema.json", "values-production.yaml",
              "files/grpo.dev_grpojobs.yaml", "templates/userroles.yaml", "templates/poddisruptionbudget.yaml"):
        assert f"grpo-operator/{f}" in names, f
    rendered = helm(helm_bin, "template", "grpo", str(tgz), "--namespace", "grpo-system").stdout
    assert "kind: CustomResourceDefinition" in rendered and f"ghcr.io/grpo-operator/grpo-operator:{VERSION}" in rendered
