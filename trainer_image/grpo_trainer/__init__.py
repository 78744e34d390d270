"""grpo_trainer: the bundled GRPO trainer (TRL GRPOTrainer) that the operator runs in every pod."""

__version__ = "0.1.0"
