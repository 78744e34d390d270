"""TRL's own GRPOConfig as the test oracle, with the world size faked (see docs/batch-rule.md)."""

from __future__ import annotations

import os
import tempfile
import warnings
from typing import Any, Optional


def trl_verdict(world_size: int, kwargs: dict[str, Any]) -> tuple[bool, Optional[str]]:
    """(accepted, TRL's message) for GRPOConfig(**kwargs) at this world size."""
    from unittest.mock import PropertyMock, patch

    from transformers import TrainingArguments
    from trl import GRPOConfig

    warnings.filterwarnings("ignore")
    out = os.path.join(tempfile.gettempdir(), "grpo-oracle")
    with patch.object(TrainingArguments, "world_size", new_callable=PropertyMock, return_value=world_size):
        try:
            GRPOConfig(output_dir=out, use_cpu=True, report_to="none", bf16=False, **kwargs)
            return True, None
        except ZeroDivisionError as exc:
            return False, f"ZeroDivisionError: {exc}"
        except ValueError as exc:
            return False, str(exc)


def trl_verdicts(rows: list[tuple[int, dict[str, Any]]]) -> list[tuple[bool, Optional[str]]]:
    return [trl_verdict(w, kw) for w, kw in rows]
