"""Start an image's container the way a kubelet would start a pod's, with runc and no container engine.

An OCI archive is unpacked once into a root filesystem (scripts/ociarchive.py unpack); every run gets its own
bundle with a config.json made from `runc spec`'s defaults, the image's config (entrypoint, cmd, env, user,
working dir) and a pod's container: command/args, env (fieldRef metadata.name/namespace), securityContext
(runAsUser/runAsGroup/fsGroup, readOnlyRootFilesystem, capabilities drop ALL, allowPrivilegeEscalation false)
and volumes (emptyDir, configMap, hostPath, persistentVolumeClaim: host folders bound in). A kubelet-style
/etc/hosts names the pod (hostname.subdomain) on its own loopback, in a network namespace of its own.
Every container is deleted (runc delete --force) when its run ends, whatever happened.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
OCIARCHIVE = REPO / "scripts" / "ociarchive.py"


def inspect(archive: Path) -> dict:
    out = subprocess.run([sys.executable, str(OCIARCHIVE), "inspect", str(archive)], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    return json.loads(out)


def rootfs(archive: Path, cache: Path) -> Path:
    """The archive unpacked, cached by its manifest (a rebuilt image gets a fresh root filesystem)."""
    info = inspect(archive)
    key = "-".join(l["digest"].split(":")[1][:12] for l in info["layers"])
    dest = cache / f"rootfs-{archive.stem}-{key}"
    if not (dest / ".unpacked").exists():
        for old in cache.glob(f"rootfs-{archive.stem}-*"):
            shutil.rmtree(old)
        tmp = dest.with_name(dest.name + ".part")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([sys.executable, str(OCIARCHIVE), "unpack", str(archive), str(tmp)], check=True, timeout=900)
        tmp.rename(dest)
        (dest / ".unpacked").touch()
    return dest


@dataclass
class Result:
    returncode: int
    output: str


def _env_value(e: dict, pod_name: str, namespace: str) -> str | None:
    if "value" in e:
        return str(e["value"])
    path = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    return {"metadata.name": pod_name, "metadata.namespace": namespace}.get(path)


def run_pod(root: Path, image_config: dict, pod: dict, work: Path, *, volumes: dict[str, Path] | None = None,
            config_maps: dict[str, dict[str, str]] | None = None, claims: dict[str, Path] | None = None,
            command: list[str] | None = None, timeout: float = 300) -> Result:
    """Runs the pod's first container. `volumes` overrides where a named volume lives on the host (emptyDir,
    hostPath), `config_maps` gives each ConfigMap's data, `claims` maps a PVC name to a host folder.
    `command` replaces the container's command+args (the image's user, env and mounts stay the pod's)."""
    spec = pod["spec"]
    c = spec["containers"][0]
    psc, csc = spec.get("securityContext", {}), c.get("securityContext", {})
    cfg_img = image_config.get("config", {})
    bundle = work / f"bundle-{uuid.uuid4().hex[:8]}"
    bundle.mkdir(parents=True)
    subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True, timeout=30)
    cfg = json.loads((bundle / "config.json").read_text())

    if command is not None:
        args = list(command)
    elif c.get("command"):
        args = c["command"] + c.get("args", [])
    else:
        args = cfg_img.get("Entrypoint", []) + (c.get("args") or cfg_img.get("Cmd") or [])
    env = dict(e.split("=", 1) for e in cfg_img.get("Env", []))
    name, ns = pod["metadata"]["name"], pod["metadata"].get("namespace", "default")
    env["HOSTNAME"] = spec.get("hostname", name)
    for e in c.get("env", []):
        v = _env_value(e, name, ns)
        if v is not None:
            env[e["name"]] = v
    uid = csc.get("runAsUser", psc.get("runAsUser"))
    gid = csc.get("runAsGroup", psc.get("runAsGroup"))
    if uid is None:  # the image's USER (numeric here; a kubelet refuses a named user under runAsNonRoot)
        u = (cfg_img.get("User") or "0").split(":")
        uid, gid = int(u[0]), int(u[1]) if len(u) > 1 else 0
    fs_group = psc.get("fsGroup")
    caps = [] if "ALL" in csc.get("capabilities", {}).get("drop", []) else cfg["process"]["capabilities"]["bounding"]
    cfg["process"].update({
        "terminal": False, "args": args, "cwd": c.get("workingDir") or cfg_img.get("WorkingDir") or "/",
        "env": [f"{k}={v}" for k, v in env.items()],
        "user": {"uid": int(uid), "gid": int(gid or 0), **({"additionalGids": [int(fs_group)]} if fs_group else {})},
        "noNewPrivileges": csc.get("allowPrivilegeEscalation") is False,
        "capabilities": {k: caps for k in ("bounding", "effective", "permitted", "inheritable", "ambient")},
    })
    cfg["root"] = {"path": str(root), "readonly": bool(csc.get("readOnlyRootFilesystem"))}
    cfg["hostname"] = spec.get("hostname", name)

    mounts = cfg["mounts"]
    hosts = bundle / "hosts"
    fqdn = f"{cfg['hostname']}.{spec['subdomain']}" if spec.get("subdomain") else cfg["hostname"]
    hosts.write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{fqdn} {fqdn}.{ns}.svc.cluster.local {cfg['hostname']}\n")
    mounts.append({"destination": "/etc/hosts", "type": "bind", "source": str(hosts), "options": ["rbind", "ro"]})
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    for vm in c.get("volumeMounts", []):
        v = vols[vm["name"]]
        if volumes and vm["name"] in volumes:
            src = volumes[vm["name"]]
        elif "emptyDir" in v:
            src = work / f"emptydir-{vm['name']}"
            src.mkdir(exist_ok=True)
            os.chmod(src, 0o777)  # a kubelet's emptyDir is world-writable
        elif "configMap" in v:
            src = work / f"configmap-{vm['name']}"
            src.mkdir(exist_ok=True)
            for k, text in (config_maps or {})[v["configMap"]["name"]].items():
                (src / k).write_text(text)
        elif "hostPath" in v:
            src = Path(v["hostPath"]["path"])
        elif "persistentVolumeClaim" in v:
            src = (claims or {})[v["persistentVolumeClaim"]["claimName"]]
        else:
            raise ValueError(f"volume {vm['name']}: type not supported here: {sorted(v)}")
        if fs_group and ("emptyDir" in v or "persistentVolumeClaim" in v):
            os.chown(src, -1, int(fs_group))  # fsGroup: group-owned and setgid, as a kubelet does
            os.chmod(src, os.stat(src).st_mode | 0o2070)
        mounts.append({"destination": vm["mountPath"], "type": "bind", "source": str(src),
                       "options": ["rbind", "ro" if vm.get("readOnly") else "rw", "nosuid", "nodev"]})
    (bundle / "config.json").write_text(json.dumps(cfg, indent=1))

    cid = f"grpo-img-test-{uuid.uuid4().hex[:10]}"
    state = work / "runc-state"
    state.mkdir(exist_ok=True)
    runc = ["runc", "--root", str(state)]
    try:
        proc = subprocess.run(["timeout", "-k", "10", str(int(timeout)), *runc, "run", "--bundle", str(bundle), cid],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout + 30)
        return Result(proc.returncode, proc.stdout)
    finally:
        subprocess.run([*runc, "delete", "--force", cid], capture_output=True, timeout=60)
