"""`kubectl grpo` as users get it: an executable kubectl-grpo on PATH (what `pip install` puts there), found by the
real kubectl's plugin lookup. The control plane, the CRD, the operator and the played kubelet are the shared ones
(tests/support)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("plugin-bin")
    exe = d / "kubectl-grpo"
    exe.write_text(f"#!{sys.executable}\nimport sys\nfrom grpo_operator.cli.kubectl_grpo import main\n"
                   "sys.exit(main())\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return d
