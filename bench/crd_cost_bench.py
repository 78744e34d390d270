"""The API server's own cost of a hostile GRPOJob, no operator running: how long kube-apiserver 1.20 and the
1.36 CEL server (apiextensions-apiserver) take to answer a create whose spec nests a value `--depths` levels deep,
or carries a flood of keys, under the places the CRD preserves (unknown keys, free-form maps).

    .venv/bin/python -m bench.crd_cost_bench [--depths 5,10,20,40,80] [--keys 5000] [--timeout 15]
        [--crd before=/tmp/before.yaml,after=generated] [--servers 1.20,1.36] [--gates ServerSideApply=false]

`generated` is the CRD `grpojob crd --kube-version` prints for that server (before 1.21: no int-or-string); a
path is used as is on both. Each CRD gets a fresh server. Each create is timed (client timeout `--timeout`); a
place whose create took over `--stop-over` seconds is not tried deeper (the machine is shared). The status says
whether the server refused the object (422), stored it (201) or never answered (0). For 1.20 it also reports
whether the server could build its server-side-apply schema from the CRD (it logs "error building openapi models"
when it cannot, and then walks every object without a schema). Figures in docs/performance.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from grpo_operator.api import crd as crdgen
from tests.support.cluster.celserver import CelServer, crd_resource_path
from tests.support.cluster.controlplane import ControlPlane
from tests.support.jobs import manifest

PLACES = {  # where a tenant puts the hostile value: unknown keys at three levels, free-form maps the CRD keeps
    "spec.unknownKey": ("unknownKey",),
    "training.unknownKey": ("training", "unknownKey"),
    "template.unknownKey": ("template", "unknownKey"),
    "training.modelInitKwargs": ("training", "modelInitKwargs"),
    "template.affinity": ("template", "affinity"),
}
MODELS_ERROR = "error building openapi models for grpojobs"


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def hostile(name: str, place: str, value: Any) -> dict[str, Any]:
    obj = manifest(name, nodes=1)
    *parents, key = PLACES[place]
    node = obj["spec"]
    for p in parents:
        node = node.setdefault(p, {})
    node[key] = value
    obj["metadata"]["namespace"] = "default"
    return obj


def measure(send: Callable[[dict[str, Any], float], Any], depths: list[int], keys: int, timeout: float,
            stop_over: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    slow: set[str] = set()
    cases = [(f"depth {d}", place, nested(d)) for d in depths for place in PLACES]
    flood = {f"k{i:05d}": i for i in range(keys)}
    cases += [(f"{keys} keys", place, flood) for place in ("training.unknownKey", "training.modelInitKwargs")] if keys else []
    for i, (what, place, value) in enumerate(cases):
        if place in slow and what.startswith("depth"):
            continue
        obj = hostile(f"h{i}", place, copy.deepcopy(value))
        t = time.perf_counter()
        try:
            r = send(obj, timeout)
            status, msg = r.status, str(r.message)[:120]
        except OSError as exc:  # a client timeout: the server never answered
            status, msg = 0, f"no answer: {exc}"[:120]
        seconds = time.perf_counter() - t
        if seconds > stop_over:
            slow.add(place)
        rows.append({"case": what, "place": place, "status": status, "seconds": round(seconds, 3), "message": msg})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def run_120(label: str, crd: dict[str, Any], a: argparse.Namespace) -> None:
    args = [f"--feature-gates={a.gates}"] if a.gates else []
    with ControlPlane(authorization_mode="AlwaysAllow", controller_manager=False, extra_apiserver_args=args) as cp:
        path = cp.workdir / "crd.json"
        path.write_text(json.dumps(crd))
        cp.kubectl("apply", "--validate=false", "-f", str(path))
        deadline = time.monotonic() + 60
        while not cp.api("GET", crd_resource_path(crd, "default")).ok and time.monotonic() < deadline:
            time.sleep(0.2)  # served once Established
        print(f"kube-apiserver 1.20, CRD {label}{' ' + a.gates if a.gates else ''}", flush=True)
        measure(lambda obj, t: cp.api("POST", crd_resource_path(crd, "default"), obj, timeout=t),
                a.depths, a.keys, a.timeout, a.stop_over)
        if "ServerSideApply=false" not in a.gates:  # without it the server builds no such schema, nor logs why
            built = MODELS_ERROR not in cp.logs(lines=100_000)
            print(json.dumps({"server-side apply schema built from the CRD": built}), flush=True)


def run_136(label: str, crd: dict[str, Any], a: argparse.Namespace) -> None:
    with CelServer() as cel:
        r = cel.create_crd(crd)
        assert r.ok, (r.status, r.message)
        print(f"apiextensions-apiserver 1.36 (CEL), CRD {label}", flush=True)
        measure(lambda obj, t: cel.request("POST", crd_resource_path(crd, "default"), obj, timeout=t),
                a.depths, a.keys, a.timeout, a.stop_over)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--depths", default="5,10,20,40,80")
    p.add_argument("--keys", type=int, default=5000)
    p.add_argument("--crd", default="after=generated",
                   help="label=path|generated[,…]: each CRD on a fresh server")
    p.add_argument("--servers", default="1.20,1.36")
    p.add_argument("--timeout", type=float, default=15.0, help="client timeout per create (s)")
    p.add_argument("--stop-over", type=float, default=10.0, help="stop deepening a place past this (s)")
    p.add_argument("--gates", default="", help="kube-apiserver 1.20 --feature-gates, e.g. ServerSideApply=false")
    a = p.parse_args()
    a.depths = [int(d) for d in a.depths.split(",")]
    for item in a.crd.split(","):
        label, _, path = item.partition("=")
        given = None if path == "generated" else yaml.safe_load(Path(path).read_text())
        if "1.20" in a.servers:
            run_120(label, given or crdgen.crd((1, 20)), a)
        if "1.36" in a.servers:
            run_136(label, given or crdgen.crd(), a)


if __name__ == "__main__":
    main()
