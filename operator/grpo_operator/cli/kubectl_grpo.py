"""`kubectl grpo`: a kubectl plugin (the console script kubectl-grpo) over grpo_operator.client.GRPOClient.

Exit codes: 0 done; 1 an error (one line on stderr: bad flags, invalid spec, no such job, API refused) or, for
`wait`, the job ended otherwise (Failed, Rejected, or finished in another phase, or deleted); 2 `wait` timed out;
130 interrupted.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, Optional

from .kubectl_out import _dump, _err, _nonneg_int, _print

PROG = "kubectl grpo"
EXAMPLES = """examples:
  kubectl grpo submit -f job.yaml
  kubectl grpo list -A
  kubectl grpo describe qwen-gsm8k
  kubectl grpo logs qwen-gsm8k -f                 # follows node rank 0 across gang restarts
  kubectl grpo logs qwen-gsm8k --rank all --tail 20
  kubectl grpo plot qwen-gsm8k --metric reward       # reward per function over the steps of every attempt
  kubectl grpo wait qwen-gsm8k --for Succeeded --timeout 2h
  kubectl grpo suspend qwen-gsm8k && kubectl grpo resume qwen-gsm8k
  kubectl grpo delete qwen-gsm8k --wait

exit codes: 0 ok; 1 error, or (wait) the job ended in another phase; 2 (wait) timed out"""


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line and exit 1, like kubectl; never argparse's exit 2 (= timeout)
        raise UsageError(f"{message} (see '{self.prog} -h')")


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def duration(text: str) -> float:
    """'90', '90s', '10m', '1h30m', '500ms' → seconds (kubectl's Go duration syntax; a bare number is seconds)."""
    t = text.strip()
    try:
        value = float(t)
    except ValueError:
        pos, value = 0, 0.0
        for m in _DURATION.finditer(t):
            if m.start() != pos:
                break
            value += float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]
            pos = m.end()
        if pos != len(t) or not t:
            raise argparse.ArgumentTypeError(f"invalid duration {text!r}: use e.g. 30s, 10m, 1h30m") from None
    if value < 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must be a finite time ≥ 0")
    return value


def _rank(text: str) -> Any:
    return "all" if text == "all" else _nonneg_int(text)


def _phases(text: str) -> list[str]:
    from grpo_operator.client import PHASES

    phases = [p.strip() for p in text.split(",") if p.strip()]
    if not phases or any(p not in PHASES for p in phases):
        raise UsageError(f"--for {text!r}: phases are {', '.join(PHASES)}")
    return phases


def _json_or_yaml(text: str) -> str:
    if text == "wide":
        raise UsageError("-o wide applies to list only")
    return text


class _Refuse(argparse.Action):
    """A flag of another verb that kubectl users type out of habit (-A, -o): a pointed one-line error instead of
    argparse's 'unrecognized arguments'."""

    def __init__(self, option_strings: Sequence[str], dest: str, message: str = "", **kwargs: Any):
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)
        self.message = message

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: Optional[str] = None) -> None:
        raise UsageError(self.message)


LIST_HELP = "list GRPOJobs: phase, attempt, nodes, step, reward, age"


def parser() -> argparse.ArgumentParser:
    """The verbs, each with its own flags and its function (args.func); -n, --context, --kubeconfig everywhere."""
    common = _Parser(add_help=False)
    g = common.add_argument_group("global flags")
    g.add_argument("-n", "--namespace", default=argparse.SUPPRESS, help="namespace (default: the context's)")
    g.add_argument("--context", default=argparse.SUPPRESS, help="kube-config context")
    g.add_argument("--kubeconfig", default=argparse.SUPPRESS, help="kube-config file (default: $KUBECONFIG)")
    p = _Parser(prog=PROG, parents=[common], description="Submit, watch and steer GRPOJobs.", epilog=EXAMPLES,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def cmd(name: str, help_: str, func: Callable[[Any, argparse.Namespace], int],
            output: bool = True) -> argparse.ArgumentParser:
        c = sub.add_parser(name, parents=[common], help=help_, description=help_, prog=f"{PROG} {name}")
        c.set_defaults(func=func)
        c.add_argument("-A", "--all-namespaces", nargs=0, action=_Refuse,
                       message=f"-A/--all-namespaces applies to list only, not {name}")
        if output:
            c.add_argument("-o", "--output", type=_json_or_yaml, choices=("json", "yaml"), help="output format")
        else:
            c.add_argument("-o", "--output", action=_Refuse, message=f"-o does not apply to {name}")
        return c

    s = cmd("submit", "validate a GRPOJob manifest locally (the webhook's validator), then create it", _submit)
    s.add_argument("-f", "--filename", required=True, help="the manifest (one GRPOJob document; - for stdin)")
    s.add_argument("--name", help="metadata.name (overrides the manifest's)")
    s.add_argument("--queue", help="Kueue LocalQueue (label kueue.x-k8s.io/queue-name)")
    s.add_argument("--dry-run", choices=("none", "client", "server"), default="none", nargs="?", const="client",
                   help="client: validate only, nothing sent (no kube-config needed); server: the API server "
                        "admits the job and every object the operator would create for it (pods included) with "
                        "dryRun=All, so quota, PodSecurity, policy engines and missing PriorityClasses answer now, "
                        "and nothing is created")
    ls = sub.add_parser("list", parents=[common], help=LIST_HELP, description=LIST_HELP, prog=f"{PROG} list")
    ls.set_defaults(func=_list)
    ls.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    ls.add_argument("-o", "--output", choices=("json", "yaml", "wide"), help="output format")
    ls.add_argument("-l", "--selector", help="label selector")
    cmd("describe", "a job's status, conditions, pods and events", _describe).add_argument("name")
    lg = cmd("logs", "the trainer log of a node rank (follows gang restarts with -f)", _logs, output=False)
    lg.add_argument("name")
    lg.add_argument("-f", "--follow", action="store_true", help="keep following, across gang restarts")
    lg.add_argument("--rank", type=_rank, default=0,
                    help="node rank (the N of <job>-node-N, not torch's global rank) or 'all' (default 0)")
    lg.add_argument("--tail", type=_nonneg_int, help="lines from the end of the log to start with")
    lg.add_argument("--since", type=duration, help="only lines newer than this (e.g. 10m)")
    lg.add_argument("--attempt", type=_nonneg_int, help="read this attempt's pod (default: the current one)")
    lg.add_argument("--timestamps", action="store_true", help="prefix each line with its time")
    from . import kubectl_plot

    kubectl_plot.add_arguments(cmd("plot", kubectl_plot.HELP, kubectl_plot.run))
    w = cmd("wait", "wait until the job reaches a phase (exit 0), ends otherwise (1) or times out (2)", _wait)
    w.add_argument("name")
    w.add_argument("--for", dest="phases", type=_phases, required=True,
                   help="phase(s), comma-separated: Pending, Running, Restarting, Succeeded, Failed, Suspended, "
                        "Rejected")
    w.add_argument("--timeout", type=duration, default=600.0, help="default 10m")
    cmd("suspend", "suspend the job (its pods are deleted; resume continues from the checkpoint)",
        _suspend).add_argument("name")
    cmd("resume", "resume a suspended job", _resume).add_argument("name")
    d = cmd("delete", "delete the job and its pods", _delete)
    d.add_argument("name")
    d.add_argument("--wait", action="store_true", help="return once the job and its pods are gone")
    d.add_argument("--timeout", type=duration, default=300.0, help="with --wait (default 5m)")
    return p


# ------------------------------------------------------------------------------------------------ output
def _age(ts: Optional[str], now: Optional[_dt.datetime] = None) -> str:
    """kubectl's AGE: 45s, 12m, 5h, 3d."""
    from grpo_operator.client.types import parse_time

    t = parse_time(ts)
    if t is None:
        return "-"
    secs = max(0, int(((now or _dt.datetime.now(_dt.UTC)) - t).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit}"
    return f"{secs}s"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in rows)


def _reward(job: Any) -> str:
    r = job.progress.reward if job.progress else None
    return f"{r:.3f}" if isinstance(r, (int, float)) else "-"


def _step(job: Any) -> str:
    p = job.progress
    if p is None or p.step is None:
        return "-"
    return p.display or (f"{p.step}/{p.max_steps}" if p.max_steps else str(p.step))


def list_table(jobs: Sequence[Any], all_namespaces: bool, wide: bool) -> str:
    head = (["NAMESPACE"] if all_namespaces else []) + ["NAME", "PHASE", "ATTEMPT", "NODES", "STEP", "REWARD", "AGE"]
    if wide:
        head += ["TOPOLOGY", "QUEUE", "MESSAGE"]
    rows = [head]
    for j in jobs:
        row = ([j.namespace] if all_namespaces else []) + [j.name, j.phase, str(j.attempt), str(j.nodes), _step(j),
                                                             _reward(j), _age(j.creation_timestamp)]
        if wide:
            row += [j.topology or "-", j.queue or "-", (j.message or "")[:80]]
        rows.append(row)
    return _table(rows)


def describe_text(job: Any, events: Sequence[Any], notes: Optional[dict[str, str]] = None) -> str:
    notes = notes or {}
    out = [f"Name:         {job.name}", f"Namespace:    {job.namespace}", f"Phase:        {job.phase}"]
    if job.message:
        out.append(f"Message:      {job.message}")
    waiting = job.waiting_for
    if waiting:
        out.append(f"Waiting for:  {waiting}")
    requeued = f", {job.requeues} by Kueue" if job.requeues else ""
    out += [f"Attempt:      {job.attempt} (gang restarts so far{requeued})", f"Nodes:        {job.nodes}"
            + (f" ({job.topology} nodes×processes)" if job.topology else ""),
            f"Suspend:      {str(job.suspended).lower()}"]
    if job.queue:
        out.append(f"Queue:        {job.queue}")
    if job.last_failure_reason:
        out.append(f"Last failure: {job.last_failure_reason}")
    for label, ts in (("Created", job.creation_timestamp), ("Started", job.start_time),
                      ("Completed", job.completion_time)):
        if ts:
            out.append(f"{label + ':':<13} {ts}")
    if not job.up_to_date:
        seen = "no status yet" if job.observed_generation is None else \
            f"status is for generation {job.observed_generation}"
        out.append(f"Note:         {seen}, spec is at generation {job.generation}")
    p = job.progress
    if p is not None:
        bits = [f"step {_step(job)}"]
        if p.reward is not None:
            bits.append(f"reward {p.reward:.4g}")
        if p.kl is not None:
            bits.append(f"kl {p.kl:.4g}")
        if p.tokens_per_second is not None:
            bits.append(f"{p.tokens_per_second:.4g} tokens/s")
        if p.eta_seconds is not None:
            bits.append(f"eta {int(p.eta_seconds)}s")
        out.append("Progress:     " + ", ".join(bits))
    if job.conditions:
        out.append("Conditions:")
        rows = [["  TYPE", "STATUS", "REASON", "AGE", "MESSAGE"]]
        rows += [[f"  {c.type}", c.status, c.reason or "-", _age(c.last_transition_time), c.message[:100]]
                 for c in job.conditions]
        out.append(_table(rows))
        stall = next((c for c in job.conditions if c.type == "Stalled" and c.message), None)
        if stall is not None:  # whole: the stuck rank's innermost frames are at its end (docs/operator.md#stalls)
            out.append(f"Stall:        {stall.message}")
    out.append("Pods:" if job.pods else f"Pods:         <{notes.get('pods', 'none')}>")
    if job.pods:
        rows = [["  RANK", "POD", "ATTEMPT", "PHASE", "NODE", "DETAIL"]]
        for pod in job.pods:
            rows.append([f"  {pod.rank if pod.rank is not None else pod.role}", pod.name, str(pod.attempt),
                         pod.phase + (" (deleting)" if pod.deleting else ""), pod.node_name or "-",
                         pod.detail or "-"])
        out.append(_table(rows))
    out.append("Events:" if events else f"Events:       <{notes.get('events', 'none')}>")
    if events:
        rows = [["  TYPE", "REASON", "AGE", "OBJECT", "MESSAGE"]]
        for e in events[-20:]:
            rows.append([f"  {e.type}", e.reason, _age(e.last_time) + (f" (x{e.count})" if e.count > 1 else ""),
                         f"{e.object_kind.lower()}/{e.object_name}", e.message[:120]])
        out.append(_table(rows))
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------ commands
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


def run(args: argparse.Namespace, make_client: Callable[..., Any]) -> int:
    """The verb's function (set by parser()) with a client for the global flags."""
    if args.func is _submit:
        _precheck(args)
        if args.dry_run == "client":
            _print(f"grpojob.grpo.dev/{args.filename['metadata'].get('name') or args.name} valid (dry run)")
            return 0
    client = make_client(namespace=getattr(args, "namespace", None), context=getattr(args, "context", None),
                         config_file=getattr(args, "kubeconfig", None))
    return int(args.func(client, args))


def _show(job: Any, output: Optional[str], done: str) -> None:
    _print(_dump(job.as_dict(), output) if output else f"grpojob.grpo.dev/{job.name} {done}")


def _submit(client: Any, args: argparse.Namespace) -> int:
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


def _list(client: Any, args: argparse.Namespace) -> int:
    jobs = client.list_jobs(all_namespaces=args.all_namespaces, label_selector=args.selector)
    if args.output in ("json", "yaml"):
        _print(_dump([j.as_dict() for j in jobs], args.output))
    elif not jobs:
        where = "any namespace" if args.all_namespaces else f"namespace {client.namespace}"
        _err(f"no GRPOJobs found in {where}")
    else:
        _print(list_table(jobs, args.all_namespaces, args.output == "wide"))
    return 0


def _describe(client: Any, args: argparse.Namespace) -> int:
    from grpo_operator.client import ApiError

    notes: dict[str, str] = {}
    try:
        job = client.get_job(args.name)
    except ApiError as exc:  # allowed to read jobs but not pods: describe the job anyway
        if exc.status != 403:
            raise
        job, notes["pods"] = client.get_job(args.name, pods=False), str(exc)
    try:
        events = client.get_job_events(args.name)
    except ApiError as exc:
        if exc.status != 403:
            raise
        events, notes["events"] = [], str(exc)
    if args.output:
        data = job.as_dict()
        data["events"] = [e.__dict__ for e in events]
        if notes:
            data["forbidden"] = notes
        _print(_dump(data, args.output))
    else:
        _print(describe_text(job, events, notes))
    return 0


def _wait(client: Any, args: argparse.Namespace) -> int:
    from grpo_operator.client import JobFailed, UnreachableStatus, WaitTimeout

    try:
        job = client.wait_for_job_status(args.name, set(args.phases), timeout=args.timeout)
    except WaitTimeout as exc:
        _err(f"timed out: {exc}")
        return 2
    except (JobFailed, UnreachableStatus) as exc:
        _err(str(exc))
        return 1
    _show(job, args.output, job.phase)
    return 0


def _suspend(client: Any, args: argparse.Namespace) -> int:
    _show(client.suspend_job(args.name), args.output, "suspended")
    return 0


def _resume(client: Any, args: argparse.Namespace) -> int:
    _show(client.resume_job(args.name), args.output, "resumed")
    return 0


def _delete(client: Any, args: argparse.Namespace) -> int:
    client.delete_job(args.name, wait=args.wait, timeout=args.timeout)
    _print(f"grpojob.grpo.dev/{args.name} deleted")
    return 0


def _logs(client: Any, args: argparse.Namespace) -> int:
    since = None if args.since is None else max(1, int(args.since + 0.999))
    kw = dict(follow=args.follow, tail_lines=args.tail, since_seconds=since, attempt=args.attempt)
    if args.rank == "all":
        lines = client.follow_all_ranks(args.name, **kw)
    else:
        lines = client.follow_job_logs(args.name, args.rank, **kw)
    first_attach: dict[int, bool] = {}
    status = 0
    for line in lines:
        if line.kind == "attach":
            if first_attach.get(line.rank):
                _err(f"rank {line.rank}: gang restart, now following attempt {line.attempt} (pod {line.pod})")
            first_attach[line.rank] = True
            continue
        if line.kind == "error":
            _err(line.text)
            status = 1
            continue
        text = f"{line.time} {line.text}" if args.timestamps and line.time else line.text
        sys.stdout.write((f"[rank {line.rank}] {text}" if args.rank == "all" else text) + "\n")
        sys.stdout.flush()
    return status


def main(argv: Optional[Sequence[str]] = None, make_client: Optional[Callable[..., Any]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser().parse_args(argv)
        if make_client is None:
            from grpo_operator.client import GRPOClient

            make_client = GRPOClient
        return run(args, make_client)
    except UsageError as exc:
        _err(f"error: {exc}")
        return 1
    except SystemExit as exc:  # -h/--help
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `kubectl grpo logs x | head`
        try:
            sys.stdout = open("/dev/null", "w")
        except OSError:
            pass
        return 0
    except Exception as exc:
        from grpo_operator.client import GRPOClientError, InvalidJob

        if isinstance(exc, InvalidJob) and exc.errors:  # one line per field error, each with its fix
            where = f"{exc.source}: " if exc.source else ""
            for field, message in exc.errors:
                _err(f"error: {where}{field + ': ' if field else ''}{message}")
            return 1
        if isinstance(exc, (GRPOClientError, ValueError)):
            _err(f"error: {exc}")
            return 1
        _err(f"error: unexpected {type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
