"""This machine's process tree, read from /proc: what a test needs to find a launcher's workers and to prove none is
left behind."""

from __future__ import annotations

import os
from pathlib import Path


def descendants(root: int) -> dict[int, str]:
    """Descendants of root → command line."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out: dict[int, str] = {}
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), []):
            try:
                out[c] = Path(f"/proc/{c}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def rank_of(pid: int) -> str | None:
    """A trainer worker's global rank: from its name (grpo-rank-N: workers forked by grpo_trainer.launch, whose
    environment in /proc is the forkserver's), else torchrun's RANK in its environment; None for anything else."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    if comm.startswith("grpo-rank-"):
        return comm[len("grpo-rank-"):]
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for kv in env:
        if kv.startswith(b"RANK="):
            return kv[5:].decode()
    return None
