"""`kubectl grpo submit -f job.yaml`: the manifest read and validated locally (the webhook's validator) before any
kube-config is, its warnings printed as kubectl prints the API server's; --dry-run=client stops there, =server asks the
API server to admit the job and every object the operator would create for it; otherwise the job is created.

It may import the standard library, grpo_operator.client and kubectl_out; not kubectl_grpo (which imports it).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

from .kubectl_out import _dump, _err, _print, _show

HELP = "validate a GRPOJob manifest locally (the webhook's validator), then create it"


def add_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("-f", "--filename", required=True, help="the manifest (one GRPOJob document; - for stdin)")
    s.add_argument("--name", help="metadata.name (overrides the manifest's)")
    s.add_argument("--queue", help="Kueue LocalQueue (label kueue.x-k8s.io/queue-name)")
    s.add_argument("--dry-run", choices=("none", "client", "server"), default="none", nargs="?", const="client",
                   help="client: validate only, nothing sent (no kube-config needed); server: the API server "
                        "admits the job and every object the operator would create for it (pods included) with "
                        "dryRun=All, so quota, PodSecurity, policy engines and missing PriorityClasses answer now, "
                        "and nothing is created")


def _precheck(args: argparse.Namespace) -> None:
    """submit: the manifest read and validated before any kube-config is (a spec error is the first thing said), its
    warnings printed as kubectl prints the API server's; args.filename becomes the body, so stdin is read once."""
    from grpo_operator.client import InvalidJob
    from grpo_operator.client import _contract as c
    from grpo_operator.client.inputs import body_from

    body, source = body_from(args.filename, args.name)
    checked = {**body, "metadata": {**(body.get("metadata") or {}), **({"name": args.name} if args.name else {})}} \
        if isinstance(body.get("metadata", {}), dict) else body
    result = c.validate(checked)
    if not result.valid:
        raise InvalidJob([(e.field, e.message) for e in result.errors], source)
    for w in result.warnings:
        sys.stderr.write(f"Warning: {w}\n")
    args.filename = body


def before_client(args: argparse.Namespace) -> Optional[int]:
    """What submit does before a client is made: the precheck, and for --dry-run=client all of it (its exit code)."""
    _precheck(args)
    if args.dry_run == "client":
        _print(f"grpojob.grpo.dev/{args.filename['metadata'].get('name') or args.name} valid (dry run)")
        return 0
    return None


def run(client: Any, args: argparse.Namespace) -> int:
    if args.dry_run == "server":
        return _dry_run(client, args)
    job = client.create_job(args.filename, name=args.name, queue=args.queue)
    _show(job, args.output, "created")
    return 0


def _dry_run(client: Any, args: argparse.Namespace) -> int:
    report = client.dry_run_job(args.filename, name=args.name, queue=args.queue)
    if args.output:
        _print(_dump(report.as_dict(), args.output))
    else:
        _print(f"grpojob.grpo.dev/{report.job.name} created (server dry run)")
        for o in report.objects:
            _print(f"{o.kind.lower()}/{o.name} {'created (server dry run)' if o.ok else 'refused'}")
    for o in report.refused:
        _err(f"error: {o.kind.lower()}/{o.name}: {o.error}")
    return 0 if not report.refused else 1
