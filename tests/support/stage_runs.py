"""Download pods for tests without a kubelet: `python -m grpo_trainer.stage` as a process against the Hub emulator
(tests/support/hub.py), its GRPO_STAGE records read as they come, and a model whose commits a probe tells apart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_trainer import contract
from tests.support.hub import HubEmulator
from tests.support.trainer import REPO, TINY_DATA, TINY_MODEL

ROWS = TINY_DATA.read_bytes().splitlines(keepends=True)


def model_files(mark: str) -> dict[str, bytes]:
    """The tiny model, its config tagged with `mark` (what a probe reads back to tell the commits apart)."""
    files = {p.name: p.read_bytes() for p in TINY_MODEL.iterdir()}
    files["config.json"] = json.dumps({**json.loads(files["config.json"]), "grpo_test_mark": mark}).encode()
    return files


def env_for(hub: HubEmulator, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE") and k != "HF_TOKEN"}
    env.update(HF_ENDPOINT=hub.url, HF_HOME=str(home), PYTHONPATH=f"{REPO / 'trainer_image'}",
               GRPO_STAGE_BACKOFF_SECONDS="0.05", HF_HUB_ETAG_TIMEOUT="5", HF_HUB_DOWNLOAD_TIMEOUT="60",
               OMP_NUM_THREADS="1")
    env.update(extra)
    return env


class StageRun:
    """One download pod: the stage process, its GRPO_STAGE records as they come (a reader thread)."""

    def __init__(self, config: Path, env: dict[str, str], termination: Path) -> None:
        self.records: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self.stderr = config.parent / "stderr"
        with self.stderr.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", contract.STAGE_MODULE, "--config", str(config)],
                                         stdout=subprocess.PIPE, stderr=err, text=True,
                                         env={**env, "GRPO_TERMINATION_LOG": str(termination)})
        self.termination = termination
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(contract.STAGE_PREFIX):
                with self._changed:
                    self.records.append(json.loads(line[len(contract.STAGE_PREFIX):]))
                    self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, pred: Callable[[dict[str, Any]], bool], timeout: float = 120) -> dict[str, Any]:
        """The first record that satisfies `pred`, as soon as the process prints it."""
        with self._changed:
            found = self._changed.wait_for(
                lambda: next((r for r in self.records if pred(r)), None) or not self._reader.is_alive(), timeout)
            record = next((r for r in self.records if pred(r)), None)
        assert record is not None, f"no such record (got {self.records}; exit {self.proc.poll()}): {found}"
        return record

    def finish(self) -> dict[str, Any]:
        self.proc.wait(timeout=300)
        self._reader.join(30)  # the reader alone reads stdout: every record is in self.records
        assert self.proc.returncode == 0, self.stderr.read_text()[-3000:]
        return self.wait_for(lambda r: r.get("event") == "done", timeout=5)
