"""The trainer's start in the real image, off the node, against the host venv (docs/performance.md, "The journey").

    sudo .venv/bin/python bench/image_start_bench.py [--rounds 3] [--poll] [--archive out/images/grpo-trainer-cpu.tar]

One process each, alternately: `python -m grpo_trainer.launch --nnodes=1 --nproc-per-node=1 --rdzv-backend=c10d …
-m grpo_trainer --config …` of the journey's tiny job (tests/support/journey.py `tiny_job`, one process: batch 4, 2
steps), timed from the start to each output line (the workers' first output, the first GRPO_PROGRESS step).
  * image: the CPU image archive (scripts/build-images.sh) loaded with buildah into its own storage and run with runc
    as a pod runs it: read-only root, uid 1000, no capabilities, the env and config.json `grpojob render` gives,
    /tmp a fresh folder (the emptyDir: HOME, HF_HOME), examples/local-tiny's model and data on /models/tiny and /data.
  * host: the same argv with this venv's python, the same env, a fresh HOME.
  * --poll: also the image with journey_bench's wait loop beside it (3 kubectl processes, then 0.3 s), here against a
    closed port: kubectl's own start only.
Needs root, buildah and runc (scripts/build-images.sh installs them). Nothing here touches a cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bench/ is not a package: reach tests.support like `python -m pytest` does

from tests.support.journey import PROGRESS, tiny_job
from tests.support.node import TOOLS

EXAMPLE = REPO / "examples" / "local-tiny"
IMAGE_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "VIRTUAL_ENV": "/opt/venv", "HF_HUB_DISABLE_TELEMETRY": "1",
             "PATH": "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


def rendered(state: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """(the trainer container's env, its config.json) as `grpojob render` gives them for the tiny job, one process."""
    job = tiny_job("probe", max_steps=2, save_steps=2)
    path = state / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    out = subprocess.run([str(Path(sys.executable).parent / "grpojob"), "render", "-n", "probe", str(path)],
                         check=True, capture_output=True, text=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    pod = next(d for d in docs if d["kind"] == "Pod")
    env = {e["name"]: e.get("value", "probe-node-0" if e["name"] == "POD_NAME" else "probe")
           for e in pod["spec"]["containers"][0]["env"]}
    config = json.loads(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["config.json"])
    config["training"]["per_device_train_batch_size"] = 4  # one process: TRL's batch rule (generation batch ≥ 4)
    return env, config


def load_image(state: Path, archive: Path, name: str) -> str:
    """The image's root filesystem (a buildah working container in this bench's own storage)."""
    bh = ["buildah", "--root", f"{state}/storage", "--runroot", f"{state}/run", "--storage-driver", "overlay"]
    if subprocess.run([*bh, "inspect", "--type", "image", name], capture_output=True).returncode != 0:
        subprocess.run([*bh, "pull", "-q", f"oci-archive:{archive}:{name}"], check=True, capture_output=True)
    subprocess.run([*bh, "rm", "image-start"], capture_output=True)
    subprocess.run([*bh, "from", "--name", "image-start", name], check=True, capture_output=True)
    return subprocess.run([*bh, "mount", "image-start"], check=True, capture_output=True, text=True).stdout.strip()


def launcher_argv(python: str, config: str) -> list[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [python, "-m", "grpo_trainer.launch", "--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=probe-0", "--max-restarts=0", "-m", "grpo_trainer",
            "--config", config]


def runc_bundle(work: Path, rootfs: str, argv: list[str], env: dict[str, str]) -> None:
    subprocess.run(["runc", "spec"], cwd=work, check=True)
    spec = json.loads((work / "config.json").read_text())
    spec["root"] = {"path": rootfs, "readonly": True}
    spec["hostname"] = "probe-node-0"
    proc = spec["process"]
    proc.update(terminal=False, args=argv, cwd="/home/grpo", noNewPrivileges=True,
                user={"uid": 1000, "gid": 1000, "additionalGids": [1000]},
                env=[f"{k}={v}" for k, v in env.items()] + ["HOSTNAME=probe-node-0"],
                capabilities={k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")})
    spec["linux"]["namespaces"] = [n for n in spec["linux"]["namespaces"] if n["type"] != "network"]
    (work / "hosts").write_text("127.0.0.1 localhost\n127.0.1.1 probe-node-0\n")
    for src, dst, ro in ((work / "tmp", "/tmp", False), (work / "etc-grpo", "/etc/grpo", True),
                         (work / "ckpt", "/ckpt", False), (EXAMPLE / "model", "/models/tiny", True),
                         (EXAMPLE / "data", "/data", True), (Path("/etc/resolv.conf"), "/etc/resolv.conf", True),
                         (work / "hosts", "/etc/hosts", True)):
        spec["mounts"].append({"destination": dst, "type": "bind", "source": str(src),
                               "options": ["rbind", "ro" if ro else "rw"]})
    (work / "config.json").write_text(json.dumps(spec))


def poll_loop(stop: threading.Event) -> None:
    """journey_bench's wait for the first step: `kubectl get pods -o json`, `kubectl logs` of each pod, 0.3 s."""
    base = [str(TOOLS / "kubectl"), "--server", "https://127.0.0.1:1", "--insecure-skip-tls-verify", "--request-timeout", "2s"]
    while not stop.is_set():
        for args in (["get", "pods", "-o", "json"], ["logs", "probe-node-0"], ["logs", "probe-node-1"]):
            subprocess.run([*base, *args], capture_output=True)
        time.sleep(0.3)


def one(state: Path, variant: str, rootfs: str, env: dict[str, str], config: dict[str, Any],
        n: int) -> dict[str, Any]:
    work = state / f"work-{variant}"
    shutil.rmtree(work, ignore_errors=True)
    for d in ("tmp", "etc-grpo", "ckpt"):
        (work / d).mkdir(parents=True)
    for d in ("tmp", "ckpt"):
        os.chown(work / d, 1000, 1000)
    if variant.startswith("image"):
        cfg = {**config, "outputDir": "/ckpt/probe"}
        (work / "etc-grpo" / "config.json").write_text(json.dumps(cfg))
        runc_bundle(work, rootfs, launcher_argv("python", "/etc/grpo/config.json"), {**IMAGE_ENV, **env})
        argv, penv = ["runc", "run", "--bundle", str(work), f"image-start-{os.getpid()}-{n}"], dict(os.environ)
    else:
        cfg = {**config, "model": str(EXAMPLE / "model"), "outputDir": str(work / "ckpt" / "probe"),
               "dataset": {**config["dataset"], "name": str(EXAMPLE / "data" / "arithmetic.jsonl")}}
        (work / "etc-grpo" / "config.json").write_text(json.dumps(cfg))
        argv = launcher_argv(str(REPO / ".venv" / "bin" / "python"), str(work / "etc-grpo" / "config.json"))
        penv = {**os.environ, **env, "HOME": str(work / "tmp"), "HF_HOME": str(work / "tmp" / "hf-home"),
                "PYTHONPATH": str(REPO / "trainer_image")}
    stop = threading.Event()
    poller = threading.Thread(target=poll_loop, args=(stop,)) if variant.endswith("+poll") else None
    t0 = time.time()
    if poller:
        poller.start()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=penv, text=True)
    assert proc.stdout is not None
    row: dict[str, Any] = {"variant": variant}
    for line in proc.stdout:
        at = round(time.time() - t0, 2)
        row.setdefault("first_output_s", at)
        if line.startswith(PROGRESS):
            row.setdefault("first_step_s", at)
    row["rc"] = proc.wait()
    stop.set()
    if poller:
        poller.join()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--archive", type=Path, default=REPO / "out" / "images" / "grpo-trainer-cpu.tar")
    ap.add_argument("--image", default="ghcr.io/grpo-operator/grpo-trainer:0.1.0-cpu")
    ap.add_argument("--poll", action="store_true", help="also the image with journey_bench's wait loop beside it")
    ap.add_argument("--state", type=Path, default=Path("/tmp/grpo-image-start"),
                    help="buildah's storage and the runs' folders")
    a = ap.parse_args()
    a.state.mkdir(parents=True, exist_ok=True)
    env, config = rendered(a.state)
    rootfs = load_image(a.state, a.archive, a.image)
    variants = ["image", "host"] + (["image+poll"] if a.poll else [])
    rows = []
    for n in range(a.rounds):
        for v in variants if n % 2 == 0 else variants[::-1]:
            rows.append(one(a.state, v, rootfs, env, config, n))
            print(json.dumps(rows[-1]), flush=True)
    for key in ("first_output_s", "first_step_s"):
        medians = {v: statistics.median(r[key] for r in rows if r["variant"] == v and key in r) for v in variants}
        print(key, {v: round(m, 2) for v, m in medians.items()},
              {"image ÷ host": round(medians["image"] / medians["host"], 2),
               **({"image+poll ÷ image": round(medians["image+poll"] / medians["image"], 2)} if a.poll else {})})
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
