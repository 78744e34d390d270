"""`grpojob`: check | render | run --local | crd — thin I/O around validation, manifests and crd."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import Any, Optional

import yaml

from ..api import crd
from ..render import job as render_job
from ..render import manifests, netpol, vllm_server
from ..rules import defaults, memory, validation
from ..rules.limits import NO_LIMITS, Limits
from . import documents

EXIT_OK, EXIT_INVALID, EXIT_UNREADABLE = 0, 1, 2


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the trainer config JSON) as readable literal blocks; plain YAML without anchors and
    aliases (`&id001`) where objects share a dict, as the vLLM server's probes do."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


_WARNING_FIELD = re.compile(r"^(spec(?:\.[A-Za-z0-9_]+|\[[^\]]*\])*)(?=[: ]|$)")


def warning_entry(text: str) -> dict[str, str]:
    """A warning as `check -o json` carries it (DESIGN.md): {field, message}, the field being the spec path the
    warning starts with ("" when it names none)."""
    m = _WARNING_FIELD.match(text)
    field = m.group(1) if m else ""
    rest = text[len(field):]
    return {"field": field, "message": rest[1:].strip() if rest.startswith(":") else text}


def _entry(file: str, name: str, res: validation.ValidationResult) -> dict[str, Any]:
    return {
        "file": file,
        "name": name,
        "valid": res.valid,
        "errors": [e.as_dict() for e in res.errors],
        "warnings": [warning_entry(w) for w in res.warnings],
        "batch": res.batch,
    }


def _unreadable(file: str, message: str) -> dict[str, Any]:
    return {"file": file, "name": "", "valid": False, "errors": [{"field": "", "message": message}], "warnings": [],
            "batch": None}


def _text(entry: dict[str, Any], warnings: Sequence[str] = (), notes: Sequence[str] = ()) -> str:
    label = f"{entry['file']}: {entry['name'] or '<unnamed>'}"
    lines = []
    b = entry["batch"]
    if entry["valid"]:
        detail = ""
        if b:
            detail = (f" (world size {b['worldSize']} = {b['worldSize'] // b['nprocPerNode']} node(s) × "
                      f"{b['nprocPerNode']}; generation batch {b['generationBatchSize']}, "
                      f"{b['stepsPerGeneration']} step(s)/generation, {b['promptsPerGeneration']} prompts/generation)")
        lines.append(f"{label}: valid{detail}")
    else:
        lines.append(f"{label}: invalid")
        for e in entry["errors"]:
            where = f"{e['field']}: " if e["field"] else ""
            lines.append(f"  error: {where}{e['message']}")
    lines += [f"  {n}" for n in notes]
    for w in warnings:
        lines.append(f"  warning: {w}")
    return "\n".join(lines)


def _notes(res: validation.ValidationResult) -> list[str]:
    """What the text output explains beyond the batch: each GPU's memory (rules/memory.py) and, in server mode, the
    server's GPUs next to the trainers'."""
    if not res.valid or res.job is None or res.topology is None:
        return []
    topo = res.topology
    notes = memory.explain(res.job, topo.world_size) if topo.gpu_resource else []  # GPU figures for GPU jobs only
    if res.job.spec.vllm.mode == "server":
        trainers = (f"trainers: {topo.nodes} pod(s) × {topo.gpus_per_node} {topo.gpu_resource}" if topo.gpu_resource
                    else f"trainers: {topo.nodes} pod(s) on CPU")
        notes.append(f"{trainers} (the world size); {vllm_server.gpu_summary(res.job, topo.gpu_resource)}")
    return notes


def check_files(paths: Sequence[str], notes: Optional[list[list[str]]] = None, limits: Limits = NO_LIMITS,
                ) -> tuple[int, list[dict[str, Any]], list[list[str]]]:
    """(exit code, one JSON entry per document, the warnings of each entry); `notes`, when given, receives each
    entry's explanations for the text output. `limits`: the platform's job defaults (--defaults FILE)."""
    code = EXIT_OK
    entries: list[dict[str, Any]] = []
    warnings: list[list[str]] = []
    for path in paths:
        file = documents.display_name(path)
        try:
            docs = documents.load_file(path)
        except documents.DocumentError as exc:
            entries.append(_unreadable(file, str(exc)))
            warnings.append([])
            if notes is not None:
                notes.append([])
            code = EXIT_UNREADABLE
            continue
        if not docs:
            entries.append(_unreadable(file, "no YAML document in the file"))
            warnings.append([])
            if notes is not None:
                notes.append([])
            code = EXIT_UNREADABLE
            continue
        for doc in docs:
            res = validation.validate(doc.body, limits)
            entries.append(_entry(file, documents.name_of(doc.body), res))
            warnings.append(res.warnings)
            if notes is not None:
                notes.append(_notes(res))
            if res.not_a_grpojob:
                code = EXIT_UNREADABLE
            elif not res.valid and code == EXIT_OK:
                code = EXIT_INVALID
    return code, entries, warnings


def _limits(args: argparse.Namespace) -> Optional[Limits]:
    """--defaults FILE as the operator applies the chart's jobDefaults; None (after saying why) when unreadable."""
    if not args.defaults:
        return NO_LIMITS
    try:
        with open(args.defaults, encoding="utf-8") as f:
            return Limits(job_defaults=defaults.parse(f.read(1024 * 1024), args.defaults))
    except (OSError, ValueError) as exc:
        print(f"grpojob {args.command}: error: --defaults: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return None


def cmd_check(args: argparse.Namespace) -> int:
    notes: list[list[str]] = []
    limits = _limits(args)
    if limits is None:
        return EXIT_UNREADABLE
    code, entries, warnings = check_files(args.files, notes, limits)
    if args.output == "json":
        print(json.dumps(entries, indent=2, ensure_ascii=False))
    else:
        for e, w, n in zip(entries, warnings, notes, strict=False):
            print(_text(e, w, n))
    return code


def _namespace(body: dict, override: Optional[str]) -> str:
    if override:
        return override
    meta = body.get("metadata") or {}
    ns = meta.get("namespace") if isinstance(meta, dict) else None
    return ns if isinstance(ns, str) and ns else "default"


def _attempt(value: str) -> int:
    """--attempt: a whole number ≥ 0 (else argparse's usage error, naming the flag)."""
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not an attempt number (a whole number ≥ 0, as status.restarts)")
    return int(value)


def cmd_render(args: argparse.Namespace) -> int:
    if args.namespace is not None and not validation.valid_namespace(args.namespace):
        print(f"grpojob render: error: --namespace: {validation.namespace_problem(args.namespace)}", file=sys.stderr)
        return EXIT_UNREADABLE
    file = documents.display_name(args.file)
    try:
        docs = documents.load_file(args.file)
    except documents.DocumentError as exc:
        print(f"{file}: error: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    try:
        access = None if args.no_network_policy else netpol.Access(
            operator_namespace=args.operator_namespace,
            operator_labels=netpol.parse_labels("--operator-labels", args.operator_labels))
    except ValueError as exc:
        print(f"grpojob render: error: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    limits = _limits(args)
    if limits is None:
        return EXIT_UNREADABLE
    objects: list[dict[str, Any]] = []
    code = EXIT_OK
    for doc in docs:
        res = validation.validate(doc.body, limits)
        if not res.valid or res.job is None or res.topology is None:
            name = documents.name_of(doc.body) or "<unnamed>"
            for e in res.errors:
                print(f"{file}: {name}: error: {e.field + ': ' if e.field else ''}{e.message}", file=sys.stderr)
            code = EXIT_UNREADABLE if res.not_a_grpojob else max(code, EXIT_INVALID)
            continue
        objects += render_job.render(res.job, res.topology, _namespace(doc.body, args.namespace), image=args.image,
                                     cpu_image=args.cpu_image,
                                     attempt=args.attempt, network_policy=access)
    if code != EXIT_OK:
        return code
    if not objects:
        print(f"{file}: error: no GRPOJob in the file", file=sys.stderr)
        return EXIT_UNREADABLE
    sys.stdout.write(yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1000))
    return EXIT_OK


def cmd_crd(args: argparse.Namespace) -> int:
    try:
        kube = crd.parse_kube_version(args.kube_version) if args.kube_version else None
    except ValueError as exc:
        print(f"grpojob crd: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    sys.stdout.write(crd.crd_yaml(kube))
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    if not args.local:
        print("grpojob run: only --local is supported (to run on a cluster: kubectl apply -f FILE)", file=sys.stderr)
        return EXIT_UNREADABLE
    from . import local_run  # imported lazily: it is the only command that starts processes

    return local_run.main(args)


DEFAULTS_HELP = ("the platform's job defaults, as the operator applies them: a YAML spec.template, or a Helm values "
                 "file with jobDefaults")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grpojob", description="Validate, render and run GRPOJob manifests.")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("check", help="validate GRPOJob documents with the webhook's own code")
    c.add_argument("files", nargs="+", metavar="FILE", help="YAML files; - reads standard input")
    c.add_argument("-o", "--output", choices=("text", "json"), default="text")
    c.add_argument("--defaults", metavar="FILE", help=DEFAULTS_HELP)
    c.set_defaults(func=cmd_check)

    r = sub.add_parser("render", help="print every object the operator would create for the job")
    r.add_argument("file", metavar="FILE", help="a YAML file; - reads standard input")
    r.add_argument("--namespace", "-n", default=None)
    r.add_argument("--image", default=manifests.DEFAULT_TRAINER_IMAGE, help="trainer image of pods with GPUs "
                   "(the operator's GRPO_TRAINER_IMAGE; default %(default)s)")
    r.add_argument("--cpu-image", default=manifests.DEFAULT_CPU_TRAINER_IMAGE, help="trainer image of pods without "
                   "GPUs (the operator's GRPO_TRAINER_CPU_IMAGE; default %(default)s)")
    r.add_argument("--defaults", metavar="FILE", help=DEFAULTS_HELP)
    r.add_argument("--attempt", type=_attempt, default=0, metavar="N",
                   help="the objects of attempt N (status.restarts after N gang restarts; default 0): its pod names "
                        "under Kueue, its annotations and rendezvous id")
    r.add_argument("--no-network-policy", action="store_true",
                   help="without the job's NetworkPolicy (as an operator with GRPO_JOB_NETWORK_POLICY=0 / the "
                        "chart's networkPolicy.perJob=false)")
    r.add_argument("--operator-namespace", default=netpol.DEFAULT_OPERATOR_NAMESPACE, metavar="NS",
                   help="the operator's namespace, admitted by the NetworkPolicy (default %(default)s)")
    r.add_argument("--operator-labels", metavar="K=V,…",
                   default=",".join(f"{k}={v}" for k, v in netpol.DEFAULT_OPERATOR_LABELS.items()),
                   help="the operator pods' labels, admitted by the NetworkPolicy (default: the chart's for release "
                        "grpo-operator, %(default)s)")
    r.set_defaults(func=cmd_render)

    run = sub.add_parser("run", help="run the job on this machine (torchrun with the pods' arguments)")
    run.add_argument("--local", action="store_true", required=True)
    run.add_argument("file", metavar="FILE")
    run.add_argument("--output-dir", default=None, help="checkpoints (default: ./runs/<job name>)")
    run.add_argument("--nproc", type=int, default=None, help="processes (default: local GPUs, else the spec's)")
    run.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    run.add_argument("--no-progress", action="store_true", help="plain log output instead of a progress bar")
    run.add_argument("--fresh", action="store_true",
                     help="start over: move an existing output to <output>.old-<time> (never deleted) instead of "
                          "resuming from its checkpoint")
    run.add_argument("--cache-dir", default=None,
                     help="stage the job's Hub model and dataset into this folder first and train offline from it "
                          "(default with spec.cache: ~/.cache/grpojob/hf-cache; docs/cache.md)")
    run.set_defaults(func=cmd_run)

    k = sub.add_parser("crd", help="print the GRPOJob CustomResourceDefinition")
    k.add_argument("--kube-version", default=None, metavar="1.20",
                   help="the server's version: before 1.21 the CRD has no int-or-string, from 1.25 its spec is not atomic "
                        "(docs/install.md); without it, the CRD of crds/ (every server from 1.21)")
    k.set_defaults(func=cmd_crd)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
