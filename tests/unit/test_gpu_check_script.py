"""Keeps scripts/gpu-check.sh (and its cases 7-8, gpu-check-restart.sh) honest on a machine without a GPU: the bash
parses, every Python snippet compiles, the engine-probe driver runs the operator's real probe against a loopback HTTP
server, the wait-for-step driver sees its event, and the TRL and urllib3 names case 8's hook patches still exist.
What needs CUDA (NCCL weight sync, the kill itself) only the script on a GPU machine proves."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fake_vllm import FakeVllm

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [ROOT / "scripts" / "gpu-check.sh", ROOT / "scripts" / "gpu-check-restart.sh"]
HEREDOC = re.compile(r"<<'PY'[^\n]*\n(.*?)\nPY\n", re.S)
DASH_C = re.compile(r"\"\$PY\" -c '(.*?)'", re.S)
ENV = {**os.environ, "PYTHONPATH": f"{ROOT / 'operator'}:{ROOT / 'trainer_image'}"}


def snippet(script: Path, marker: str) -> str:
    found = [body for body in HEREDOC.findall(script.read_text()) if marker in body]
    assert len(found) == 1, f"{script.name}: {len(found)} heredocs contain {marker!r}"
    return found[0]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_parses_and_every_python_snippet_compiles(script):
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    snippets = HEREDOC.findall(text) + DASH_C.findall(text)
    assert len(snippets) >= 4
    for i, code in enumerate(snippets):
        compile(code, f"{script.name}:snippet{i}", "exec")


def test_the_main_script_sources_cases_7_and_8_and_lists_them():
    text = SCRIPTS[0].read_text()
    assert "source scripts/gpu-check-restart.sh" in text
    assert "#   7. the server kept across a trainer restart" in text and "#   8. an observation" in text


@pytest.mark.parametrize("mode, code, says", [("ok", 0, "answered"), ("error", 1, "answered 500")])
def test_the_probe_driver_runs_the_operators_engine_probe(mode, code, says):
    body = snippet(SCRIPTS[1], "generate_one_token")
    with FakeVllm(mode=mode, model="tiny") as fake:  # a request other than the probe's (tiny, 1 token) gets a 400
        out = subprocess.run([sys.executable, "-", fake.url], input=body, text=True, capture_output=True, env=ENV,
                             timeout=120)
    assert out.returncode == code, out.stderr
    assert "gpu-check: engine probe of the kept server: " in out.stdout and says in out.stdout
    assert fake.requests == 1


def test_the_wait_driver_waits_for_a_logged_step_and_a_complete_checkpoint(tmp_path):
    body = snippet(SCRIPTS[1], "resume.latest_checkpoint")
    log, out = tmp_path / "a.log", tmp_path / "out"
    log.write_text('GRPO_PROGRESS {"step":1}\nGRPO_PROGRESS {"step":2}\n')
    (out / "checkpoint-2").mkdir(parents=True)
    (out / "checkpoint-2" / "model.safetensors").write_bytes(b"x")
    (out / "checkpoint-2" / "trainer_state.json").write_text('{"global_step": 2}')
    ok = subprocess.run([sys.executable, "-", str(log), str(os.getpid()), "2", str(out)], input=body, text=True,
                        capture_output=True, env=ENV, timeout=120)
    assert ok.returncode == 0 and "logged step 2, checkpoint-2 saved" in ok.stdout, ok.stderr
    # The trainer gone before the event: a failure naming it, not a wait to the deadline.
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = subprocess.run([sys.executable, "-", str(log), str(dead.pid), "3", str(out)], input=body, text=True,
                          capture_output=True, env=ENV, timeout=120)
    assert gone.returncode == 1 and "exited before logging step 3" in gone.stderr


def _trl_module(name: str) -> ast.Module:
    spec = importlib.util.find_spec(name)
    assert spec and spec.origin, name
    return ast.parse(Path(spec.origin).read_text())


def test_case_8s_hook_patches_names_that_exist():
    """The hook wraps VLLMClient.update_named_params(metadata, named_params), which TRL's server-mode sync calls, and
    urllib3's HTTPConnection.request/getresponse; if TRL moved its sync, the hook would never fire."""
    client = next(n for n in ast.walk(_trl_module("trl.generation.vllm_client"))
                  if isinstance(n, ast.ClassDef) and n.name == "VLLMClient")
    update = next(f for f in client.body if isinstance(f, ast.FunctionDef) and f.name == "update_named_params")
    assert [a.arg for a in update.args.args] == ["self", "metadata", "named_params"]
    generation = ast.unparse(_trl_module("trl.generation.vllm_generation"))
    assert "self.vllm_client.update_named_params(self._weight_metadata, self._iter_named_params())" in generation
    import urllib3.connection

    assert callable(urllib3.connection.HTTPConnection.request)
    assert callable(urllib3.connection.HTTPConnection.getresponse)
    hook = snippet(SCRIPTS[1], "update_named_params")
    assert "vllm_client.VLLMClient.update_named_params = update_named_params" in hook
    assert 'os._exit(main(["--config", sys.argv[1]]))' in hook
    from grpo_trainer import __main__ as entry

    assert list(__import__("inspect").signature(entry.main).parameters) == ["argv"]
