"""Real pod logs through GRPOClient and `kubectl grpo logs -f` across a gang restart, for the real-node tier (a
control plane has no kubelet, so no pod log can be read there).

The node journey calls, with a GRPOJob of >= 1 node already Running real trainer processes:

    from tests.support.client_logs import check_logs_follow_gang_restart
    transcript = check_logs_follow_gang_restart(kubeconfig, namespace, "tiny",
                                                restart=lambda: node.kill_container_main_process(ns, "tiny-node-0", "trainer"))

It follows node rank 0 twice at once — with GRPOClient.follow_job_logs (to check each line's attempt) and with the
real `kubectl grpo logs -f` (the user's view, kept as the transcript) — calls restart() once attempt 0 has printed,
and asserts: attempt 0's lines come first, then attempt 1's from the same pod name; the CLI said on stderr that it
re-attached; both followers end by themselves when the job Succeeded; `kubectl grpo wait --for Succeeded` exits 0.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional


def _plugin_argv() -> list[str]:
    """`kubectl grpo` when kubectl and an installed kubectl-grpo are on PATH, else the same entrypoint directly."""
    if shutil.which("kubectl") and shutil.which("kubectl-grpo"):
        return ["kubectl", "grpo"]
    return [sys.executable, "-m", "grpo_operator.cli.kubectl_grpo"]


def check_logs_follow_gang_restart(kubeconfig: str | os.PathLike[str], namespace: str, name: str,
                                   restart: Callable[[], Any], timeout: float = 900,
                                   rank: int = 0) -> str:
    from grpo_operator.client import GRPOClient

    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    cli = [*_plugin_argv(), "-n", namespace]
    transcript: list[str] = []

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run([*cli, *args], env=env, capture_output=True, text=True, timeout=timeout)
        transcript.append(f"$ kubectl grpo {' '.join(args)}\n{r.stdout}{r.stderr}(exit {r.returncode})")
        assert not check or r.returncode == 0, transcript[-1]
        return r

    client = GRPOClient(namespace=namespace, config_file=str(kubeconfig))
    started = client.get_job(name)
    assert started.attempt == 0, f"start from attempt 0, the job is at {started.attempt}"
    lines: list[Any] = []
    first_line = threading.Event()
    error: list[BaseException] = []

    def follow() -> None:
        try:
            for line in client.follow_job_logs(name, rank, follow=True):
                lines.append(line)
                if line.kind == "log" and line.attempt == 0:
                    first_line.set()
        except BaseException as exc:
            error.append(exc)
        finally:
            first_line.set()

    follower = threading.Thread(target=follow, daemon=True, name="client-logs")
    follower.start()
    run("describe", name)
    cli_logs = subprocess.Popen([*cli, "logs", name, "-f", "--rank", str(rank), "--timestamps"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cli_out: list[str] = []
    cli_first = threading.Event()

    def read_cli() -> None:
        assert cli_logs.stdout is not None
        for ln in cli_logs.stdout:
            cli_out.append(ln)
            cli_first.set()
        cli_first.set()

    cli_reader = threading.Thread(target=read_cli, daemon=True, name="cli-logs")
    cli_reader.start()
    try:
        # both followers must be reading attempt 0 before the restart, or there is no restart to follow
        assert first_line.wait(timeout), f"no log line of attempt 0 of {name} within {timeout:g}s"
        assert cli_first.wait(timeout) and cli_out, "kubectl grpo logs -f printed nothing of attempt 0"
        assert not error, error
        restart()
        run("wait", name, "--for", "Succeeded", "--timeout", f"{int(timeout)}s")
        follower.join(timeout=120)
        assert not follower.is_alive(), "GRPOClient.follow_job_logs did not end after the job Succeeded"
        cli_logs.wait(timeout=120)
        cli_reader.join(timeout=10)
        assert cli_logs.stderr is not None
        out, err = "".join(cli_out), cli_logs.stderr.read()
    finally:
        if cli_logs.poll() is None:
            cli_logs.kill()
            cli_logs.wait()
        client.close()
    transcript.append(f"$ kubectl grpo logs {name} -f --rank {rank} --timestamps\n{out}{err}(exit {cli_logs.returncode})")
    run("describe", name)
    if error:
        raise error[0]

    logs = [x for x in lines if x.kind == "log"]
    attempts = [x.attempt for x in logs]
    assert 0 in attempts and 1 in attempts, f"lines per attempt: {sorted(set(attempts))}"
    assert attempts == sorted(attempts), "a line of attempt 0 came after attempt 1 had started"
    from grpo_operator.render.manifests import names

    assert {x.pod for x in logs} == {names(name).pod(rank)}, {x.pod for x in logs}
    assert [x.attempt for x in lines if x.kind == "attach"] == [0, 1], [x for x in lines if x.kind == "attach"]
    assert cli_logs.returncode == 0, transcript[-2]
    assert "now following attempt 1" in err, err
    # the CLI printed both attempts too: the first line of attempt 1 and the very last line
    printed = [ln.partition(" ")[2] for ln in out.splitlines()]  # --timestamps: "<time> <text>"
    first_new = next(x.text for x in logs if x.attempt == 1)
    assert first_new in printed and logs[-1].text in printed, out[-2000:]
    return "\n\n".join(transcript)


def write_transcript(text: str, path: Optional[str | os.PathLike[str]] = None) -> Path:
    """Where the journey keeps the transcript (the issue's done-when asks for it in a note)."""
    p = Path(path or os.environ.get("GRPO_TEST_TRANSCRIPT", "/tmp/kubectl-grpo-gang-restart.txt"))
    p.write_text(f"# kubectl grpo across a gang restart, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n\n{text}\n")
    return p
