"""The repository's fixed shape: README opens with the two commands, CI runs the README's test command."""

import operator
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", readme, re.S)
    assert first_block and readme.split("```bash")[0].strip() == "# grpo-operator"
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines() if line.strip()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    assert "grpojob run --local" in (ROOT / "scripts" / "demo.sh").read_text()


def test_no_package_shadows_the_standard_library_operator_module():
    assert operator.__file__ and "site-packages" not in operator.__file__ and "/work/" not in operator.__file__
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_code_and_docs_cite_only_files_of_this_repository():
    """The working notes beside the project (notes/*.md) are not in the repository: citing one is a dead end for every
    reader of the code or the docs (issue 29, item 6). Their facts are carried over in the project's own words."""
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    cite = re.compile(r"\bnotes/[\w.-]+\.md")
    found = [f"{path}:{n}" for path in tracked if path.endswith((".py", ".md", ".sh", ".yaml", ".yml", ".txt"))
             and (ROOT / path).is_file()
             for n, line in enumerate((ROOT / path).read_text(errors="replace").splitlines(), 1) if cite.search(line)]
    assert not found, f"citations of files outside the repository: {found}"
