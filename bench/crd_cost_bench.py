"""The API server's own cost of a hostile GRPOJob, no operator running: how long kube-apiserver 1.20 and the
1.36 CEL server (apiextensions-apiserver) take to answer a create whose spec nests a value `--depth` levels deep,
or carries a flood of keys, under the places the CRD preserves.

    .venv/bin/python -m bench.crd_cost_bench [--depths 10,30,100] [--keys 5000] [--crd crds/grpo.dev_grpojobs.yaml]

Each create is timed (client timeout 60 s); the answer's status code says whether the server itself refused it
(422) or stored it (201). Figures in docs/performance.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import yaml

from tests.support.cluster.celserver import CelServer, crd_resource_path
from tests.support.cluster.controlplane import ControlPlane
from tests.support.jobs import manifest

REPO = Path(__file__).resolve().parents[1]
PLACES = {  # where a tenant puts the hostile value: an unknown key, a free-form map the CRD types loosely
    "training.unknownKey": ("training", "unknownKey"),
    "training.modelInitKwargs": ("training", "modelInitKwargs"),
    "template.affinity": ("template", "affinity"),
}


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def hostile(name: str, place: str, value: Any) -> dict[str, Any]:
    obj = manifest(name, nodes=1)
    parent, key = PLACES[place]
    obj["spec"].setdefault(parent, {})[key] = value
    obj["metadata"]["namespace"] = "default"
    return obj


def cases(depths: list[int], keys: int) -> list[tuple[str, str, Any]]:
    out = [(f"depth {d}", place, nested(d)) for d in depths for place in PLACES]
    flood = {f"k{i:05d}": i for i in range(keys)}
    out += [(f"{keys} keys", place, flood) for place in ("training.unknownKey", "training.modelInitKwargs")]
    return out


def measure(send: Any, depths: list[int], keys: int) -> list[dict[str, Any]]:
    rows = []
    for i, (what, place, value) in enumerate(cases(depths, keys)):
        obj = hostile(f"h{i}", place, copy.deepcopy(value))
        t = time.perf_counter()
        try:
            r = send(obj)
            status, msg = r.status, str(r.message)[:120]
        except OSError as exc:  # a client timeout: the server never answered
            status, msg = 0, f"no answer: {exc}"[:120]
        rows.append({"case": what, "place": place, "status": status, "seconds": round(time.perf_counter() - t, 3),
                     "message": msg})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--depths", default="10,30,100")
    p.add_argument("--keys", type=int, default=5000)
    p.add_argument("--crd", default=str(REPO / "crds" / "grpo.dev_grpojobs.yaml"))
    p.add_argument("--servers", default="1.20,1.36")
    a = p.parse_args()
    depths = [int(d) for d in a.depths.split(",")]
    crd = yaml.safe_load(Path(a.crd).read_text())
    path = crd_resource_path(crd, "default")
    if "1.20" in a.servers:
        with ControlPlane(authorization_mode="AlwaysAllow", controller_manager=False) as cp:
            cp.kubectl("apply", "--validate=false", "-f", a.crd)
            cp.kubectl("wait", "--for=condition=Established", "crd/grpojobs.grpo.dev", "--timeout=60s")
            print("kube-apiserver 1.20")
            measure(lambda obj: cp.api("POST", path, obj, timeout=60), depths, a.keys)
    if "1.36" in a.servers:
        with CelServer() as cel:
            assert cel.create_crd(crd).ok
            print("apiextensions-apiserver 1.36 (CEL)")
            measure(lambda obj: cel.request("POST", path, obj, timeout=60), depths, a.keys)


if __name__ == "__main__":
    main()
