"""controller/ratelimit.py: one action per key per window, keys independent, old keys pruned."""

from __future__ import annotations

from grpo_operator.controller import ratelimit
from grpo_operator.controller.ratelimit import RateLimiter


def test_once_per_window_per_key() -> None:
    rl = RateLimiter(5.0)
    assert rl.allow(("ns", "pod-0"), now=100.0)
    assert not rl.allow(("ns", "pod-0"), now=104.9)  # within the window: the first send is on its way
    assert rl.allow(("ns", "pod-1"), now=104.9)  # another key is independent
    assert rl.allow(("ns", "pod-0"), now=105.0)  # the window passed: send again
    assert not rl.allow(("ns", "pod-0"), now=109.0)  # ... and the window restarts from that send


def test_windows_are_per_limiter() -> None:
    short, long = RateLimiter(5.0), RateLimiter(300.0)
    assert short.allow("k", now=0.0) and long.allow("k", now=0.0)
    assert short.allow("k", now=10.0)
    assert not long.allow("k", now=10.0)
    assert long.allow("k", now=300.0)


def test_old_keys_are_pruned(monkeypatch) -> None:
    monkeypatch.setattr(ratelimit, "PRUNE_ABOVE", 3)
    rl = RateLimiter(1.0)
    for i in range(3):
        assert rl.allow(i, now=0.0)
    assert rl.allow("late", now=10.0)  # a fourth key: the three whose window passed go
    assert len(rl) == 1
    assert not rl.allow("late", now=10.5)
