"""`python nosync_trainer.py --config FILE`: the trainer with TRL's vLLM weight sync turned into a no-op.

The negative control of the colocate sync test: with it, vLLM keeps generating from the initial weights while the
trained model moves, and the test's measure of the sync (vLLM's logprobs vs the trained model's) must see it."""

import os
import sys

from trl.generation import vllm_generation

vllm_generation.VLLMGeneration.sync_weights = lambda self: None

from grpo_trainer.__main__ import main  # noqa: E402

if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
