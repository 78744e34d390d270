#!/usr/bin/env python3
"""The release version in one place: pyproject.toml's [project] version. Every other file that names it is listed in
COPIES; `--check [X.Y.Z]` fails unless each names exactly that version (the tests and the release workflow run it
with the tag), `--set X.Y.Z` rewrites the source and every copy.

Usage: scripts/version.py                 print the version
       scripts/version.py --check [X.Y.Z] every copy agrees with pyproject.toml (and with X.Y.Z, e.g. the tag)
       scripts/version.py --set X.Y.Z     bump: pyproject.toml and every copy
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSION = r"(?P<v>\d+\.\d+\.\d+)"  # X.Y.Z: a PEP 440 version, a SemVer chart version and an image tag alike
IMAGE = rf"grpo-(?:trainer|operator):{VERSION}\b"  # an image reference; -cpu/-cuda variants follow the version
SOURCE = ("pyproject.toml", rf'^version = "{VERSION}"$')
COPIES: list[tuple[str, str]] = [
    ("charts/grpo-operator/Chart.yaml", rf"^version: {VERSION}$"),
    ("charts/grpo-operator/Chart.yaml", rf'^appVersion: "{VERSION}"$'),
    ("charts/grpo-operator/values.yaml", IMAGE),
    ("charts/grpo-operator/values-production.yaml", IMAGE),
    ("charts/grpo-operator/values-production.yaml", rf"--version {VERSION}\b"),
    ("operator/grpo_operator/render/manifests.py", IMAGE),
    ("trainer_image/grpo_trainer/__init__.py", rf'^__version__ = "{VERSION}"$'),
    ("examples/gitops/flux-helmrelease.yaml", IMAGE),
    ("examples/gitops/flux-helmrelease.yaml", rf"^\s+version: \"?{VERSION}\"?$"),
    ("examples/gitops/ci-check.yaml", rf"grpo-operator=={VERSION}\b"),
    ("docs/install.md", IMAGE),
    ("docs/install.md", rf"--version {VERSION}\b"),
    ("docs/images.md", IMAGE),
    ("docs/gitops.md", rf"grpo-operator=={VERSION}\b"),
]


def current(repo: Path = REPO) -> str:
    return tomllib.loads((repo / "pyproject.toml").read_text())["project"]["version"]


def mismatches(version: str, repo: Path = REPO) -> list[str]:
    """Every place that does not name `version`, as 'file: found …' lines."""
    out = []
    for path, pattern in [SOURCE, *COPIES]:
        found = [m.group("v") for m in re.finditer(pattern, (repo / path).read_text(), re.M)]
        if not found:
            out.append(f"{path}: no match for {pattern!r}")
        out += [f"{path}: {v} (want {version}; pattern {pattern!r})" for v in found if v != version]
    return out


def set_version(version: str, repo: Path = REPO) -> None:
    for path, pattern in [SOURCE, *COPIES]:
        file = repo / path
        text = re.sub(pattern, lambda m: m.group(0).replace(m.group("v"), version), file.read_text(), flags=re.M)
        file.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--check", nargs="?", const="", metavar="X.Y.Z")
    group.add_argument("--set", metavar="X.Y.Z")
    args = ap.parse_args(argv)
    if args.set is not None:
        if not re.fullmatch(VERSION, args.set):
            ap.error(f"--set {args.set}: a release version is X.Y.Z")
        set_version(args.set)
    version = current()
    if args.check is not None or args.set is not None:
        want = args.check or version
        bad = mismatches(want) + ([f"pyproject.toml: {version} (want {want})"] if version != want else [])
        if bad:
            print("version mismatch:\n  " + "\n  ".join(dict.fromkeys(bad)), file=sys.stderr)
            return 1
    print(version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
