"""`kubectl grpo`: a kubectl plugin (the console script kubectl-grpo) over grpo_operator.client.GRPOClient.

Exit codes: 0 done; 1 an error (one line on stderr: bad flags, invalid spec, no such job, API refused) or, for
`wait`, the job ended otherwise (Failed, Rejected, or finished in another phase, or deleted); 2 `wait` timed out;
130 interrupted.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, Optional

from . import kubectl_submit
from .kubectl_out import _dump, _err, _nonneg_int, _print, _show
from .kubectl_text import describe_text, list_table

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


def _common_flags() -> argparse.ArgumentParser:
    """-n, --context, --kubeconfig: the parent of the plugin's parser and of every verb's."""
    common = _Parser(add_help=False)
    g = common.add_argument_group("global flags")
    g.add_argument("-n", "--namespace", default=argparse.SUPPRESS, help="namespace (default: the context's)")
    g.add_argument("--context", default=argparse.SUPPRESS, help="kube-config context")
    g.add_argument("--kubeconfig", default=argparse.SUPPRESS, help="kube-config file (default: $KUBECONFIG)")
    return common


def _command(sub: Any, common: argparse.ArgumentParser, name: str, help_: str,
             func: Callable[[Any, argparse.Namespace], int], output: bool = True) -> argparse.ArgumentParser:
    """A verb other than list: its function, -o json|yaml (or a pointed refusal), and a pointed refusal of -A."""
    c = sub.add_parser(name, parents=[common], help=help_, description=help_, prog=f"{PROG} {name}")
    c.set_defaults(func=func)
    c.add_argument("-A", "--all-namespaces", nargs=0, action=_Refuse,
                   message=f"-A/--all-namespaces applies to list only, not {name}")
    if output:
        c.add_argument("-o", "--output", type=_json_or_yaml, choices=("json", "yaml"), help="output format")
    else:
        c.add_argument("-o", "--output", action=_Refuse, message=f"-o does not apply to {name}")
    return c


def _add_list(sub: Any, common: argparse.ArgumentParser) -> None:
    ls = sub.add_parser("list", parents=[common], help=LIST_HELP, description=LIST_HELP, prog=f"{PROG} list")
    ls.set_defaults(func=_list)
    ls.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    ls.add_argument("-o", "--output", choices=("json", "yaml", "wide"), help="output format")
    ls.add_argument("-l", "--selector", help="label selector")


def _logs_arguments(lg: argparse.ArgumentParser) -> None:
    lg.add_argument("name")
    lg.add_argument("-f", "--follow", action="store_true", help="keep following, across gang restarts")
    lg.add_argument("--rank", type=_rank, default=0,
                    help="node rank (the N of <job>-node-N, not torch's global rank) or 'all' (default 0)")
    lg.add_argument("--tail", type=_nonneg_int, help="lines from the end of the log to start with")
    lg.add_argument("--since", type=duration, help="only lines newer than this (e.g. 10m)")
    lg.add_argument("--attempt", type=_nonneg_int, help="read this attempt's pod (default: the current one)")
    lg.add_argument("--timestamps", action="store_true", help="prefix each line with its time")


def _wait_arguments(w: argparse.ArgumentParser) -> None:
    w.add_argument("name")
    w.add_argument("--for", dest="phases", type=_phases, required=True,
                   help="phase(s), comma-separated: Pending, Running, Restarting, Succeeded, Failed, Suspended, "
                        "Rejected")
    w.add_argument("--timeout", type=duration, default=600.0, help="default 10m")


def _delete_arguments(d: argparse.ArgumentParser) -> None:
    d.add_argument("name")
    d.add_argument("--wait", action="store_true", help="return once the job and its pods are gone")
    d.add_argument("--timeout", type=duration, default=300.0, help="with --wait (default 5m)")


def parser() -> argparse.ArgumentParser:
    """The verbs, each with its own flags and its function (args.func); -n, --context, --kubeconfig everywhere."""
    common = _common_flags()
    p = _Parser(prog=PROG, parents=[common], description="Submit, watch and steer GRPOJobs.", epilog=EXAMPLES,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def cmd(name: str, help_: str, func: Callable[[Any, argparse.Namespace], int],
            output: bool = True) -> argparse.ArgumentParser:
        return _command(sub, common, name, help_, func, output)

    kubectl_submit.add_arguments(cmd("submit", kubectl_submit.HELP, kubectl_submit.run))
    _add_list(sub, common)
    cmd("describe", "a job's status, conditions, pods and events", _describe).add_argument("name")
    _logs_arguments(cmd("logs", "the trainer log of a node rank (follows gang restarts with -f)", _logs,
                        output=False))
    from . import kubectl_plot

    kubectl_plot.add_arguments(cmd("plot", kubectl_plot.HELP, kubectl_plot.run))
    _wait_arguments(cmd("wait", "wait until the job reaches a phase (exit 0), ends otherwise (1) or times out (2)",
                        _wait))
    cmd("suspend", "suspend the job (its pods are deleted; resume continues from the checkpoint)",
        _suspend).add_argument("name")
    cmd("resume", "resume a suspended job", _resume).add_argument("name")
    _delete_arguments(cmd("delete", "delete the job and its pods", _delete))
    return p


# ------------------------------------------------------------------------------------------------ commands
def run(args: argparse.Namespace, make_client: Callable[..., Any]) -> int:
    """The verb's function (set by parser()) with a client for the global flags."""
    if args.func is kubectl_submit.run:
        done = kubectl_submit.before_client(args)
        if done is not None:
            return done
    client = make_client(namespace=getattr(args, "namespace", None), context=getattr(args, "context", None),
                         config_file=getattr(args, "kubeconfig", None))
    return int(args.func(client, args))


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
