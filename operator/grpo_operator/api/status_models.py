"""The GRPOJob status as pydantic models (the CRD's status schema; lifecycle builds it, the client reads it)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from .status import ConditionType, Phase, listing


class Condition(BaseModel):
    type: str = Field(description=f"Condition type: {', '.join(ConditionType)}.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="CamelCase reason.")
    message: str = Field(default="", description="Human readable message.")
    lastTransitionTime: Optional[str] = Field(default=None, description="When the status last changed (RFC 3339).")
    observedGeneration: Optional[int] = Field(default=None, description="The .metadata.generation the condition was set for.")


class BatchStatus(BaseModel):
    worldSize: int = Field(description="Training processes: nodes × nprocPerNode (vLLM server GPUs excluded).")
    nprocPerNode: int = Field(description="Training processes per node.")
    generationBatchSize: int = Field(description="Completions generated per generation round (TRL generation_batch_size).")
    stepsPerGeneration: int = Field(description="Optimizer steps per generation round.")
    promptsPerGeneration: int = Field(description="Distinct prompts per generation round (generationBatchSize / numGenerations).")


class ProgressStatus(BaseModel):
    model_config = ConfigDict(extra="allow")
    step: Optional[int] = Field(default=None, description="Current optimizer step.")
    maxSteps: Optional[int] = Field(default=None, description="Total steps.")
    reward: Optional[float] = Field(default=None, description="Mean reward at the last logging step.")
    rewardStd: Optional[float] = Field(default=None, description="Reward standard deviation.")
    rewards: Optional[dict[str, float]] = Field(
        default=None, description="Mean of each reward function at the last logging step (unweighted), by name.")
    kl: Optional[float] = Field(default=None, description="KL to the reference model.")
    completionLength: Optional[float] = Field(default=None, description="Mean completion length (tokens).")
    learningRate: Optional[float] = Field(default=None, description="Learning rate.")
    tokensPerSecond: Optional[float] = Field(default=None, description="Training throughput.")
    etaSeconds: Optional[float] = Field(default=None, description="Estimated seconds left.")
    updateTime: Optional[str] = Field(default=None, description="When the trainer logged this step (RFC 3339).")
    display: Optional[str] = Field(default=None, description="step/maxSteps, for the STEP column.")


class GRPOJobStatus(BaseModel):
    phase: Optional[Phase] = Field(default=None, description=f"{listing(Phase)}.")
    conditions: list[Condition] = Field(default_factory=list, description="Latest observations (Kubernetes API conventions).")
    batch: Optional[BatchStatus] = Field(default=None, description="The batch breakdown the operator validated.")
    progress: Optional[ProgressStatus] = Field(default=None, description="Live training progress reported by global rank 0.")
    restarts: int = Field(default=0, description="Gang restarts so far.")
    requeues: int = Field(
        default=0, description="Of the restarts, those Kueue caused (it evicted the pods) or a resume under Kueue began; "
        "they do not count against runPolicy.backoffLimit.")
    stagingRetries: int = Field(
        default=0, description="spec.cache: download pods that failed with a retryable error and were replaced "
        "(bounded by runPolicy.backoffLimit; docs/cache.md).")
    vllmServerAttempt: Optional[int] = Field(
        default=None, description="Server mode: the attempt that created the vLLM server pod the current attempt's "
        "trainers use, while that server is kept across trainer restarts (absent: the current attempt's own).")
    lastFailureReason: Optional[str] = Field(default=None, description="Why the last pod failure happened.")
    topology: Optional[str] = Field(default=None, description="nodes×GPUs, for the NODES×GPUS column.")
    startTime: Optional[str] = Field(default=None, description="When the pods were first created.")
    completionTime: Optional[str] = Field(default=None, description="When the job finished.")
    observedGeneration: Optional[int] = Field(default=None, description="Last .metadata.generation acted on.")
    message: Optional[str] = Field(default=None, description="Human readable summary of the phase.")
