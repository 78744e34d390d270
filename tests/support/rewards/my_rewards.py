"""Custom rewards for the tests, imported by the trainer as `my_rewards:<name>` from PYTHONPATH."""

import os
import time


def digits(completions, **kwargs):
    """Fraction of characters that are digits: a custom, continuous reward."""
    out = []
    for c in completions:
        text = c if isinstance(c, str) else " ".join(m["content"] for m in c)
        out.append(sum(ch.isdigit() for ch in text) / max(1, len(text)))
    marker = os.environ.get("MY_REWARDS_MARKER")
    if marker:
        with open(marker, "a") as f:
            f.write(f"{len(completions)}\n")
    return out


def slow(completions, **kwargs):
    """Like digits, but sleeps so that a test can interrupt training between steps."""
    time.sleep(float(os.environ.get("SLOW_REWARD_SECONDS", "0.5")))
    return digits(completions)


class Scorer:
    @staticmethod
    def score(completions, **kwargs):
        return [0.0 for _ in completions]


not_callable = 42


