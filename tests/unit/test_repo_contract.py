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
