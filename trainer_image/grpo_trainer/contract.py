"""The contract between the operator and the trainer, defined once: pod labels and annotations, ports, files, the
config schema version, the progress/result line prefixes and the exit codes.

The trainer imports nothing from the operator at run time; the operator imports this module (the operator image
carries grpo_trainer's sources). So it imports nothing but the standard library, and nothing heavy ever: importing
it must not pull in torch, transformers or TRL (tests/unit/test_layers.py checks that).

Exit codes: 0 success, 1-127 permanent (rerunning the same spec fails the same way: the job fails), 128 and more
retryable (128+N is "killed by signal N"; the operator restarts the gang, which resumes from the latest
checkpoint). status.lastFailureReason names the trainer's codes (DatasetError, Preempted, ...): EXIT_REASONS.
"""

from __future__ import annotations

# ---------------------------------------------------------------------------------------------- config
SCHEMA_VERSION = 1  # of the config JSON the operator renders (docs/trainer-config.md)
CONFIG_DIR = "/etc/grpo"
CONFIG_FILE = f"{CONFIG_DIR}/config.json"

# training.modelInitKwargs keys TRL or torchrun decide: refused, with the reason, by the operator at admission
# (rules/validation.py) and by the trainer (config.py).
REFUSED_INIT_KWARGS = {
    "device_map": "torchrun runs one model copy per process and TRL sets device_map itself; a device_map would "
                  "spread each copy over the GPUs of the other processes",
    "quantization_config": "quantized (QLoRA) training is not supported by this trainer yet",
    "trust_remote_code": "set training.trustRemoteCode instead (one switch for the policy, reference and reward "
                         "models, the tokenizer and vLLM)",
}

# ---------------------------------------------------------------------------------------------- pods
LABEL_JOB = "grpo.dev/job-name"
LABEL_ROLE = "grpo.dev/role"
LABEL_RANK = "grpo.dev/node-rank"
LABEL_ATTEMPT = "grpo.dev/attempt"  # selectable: one attempt's pods
ANNOTATION_ATTEMPT = "grpo.dev/attempt"  # the same key as an annotation: what the lifecycle reads
ANNOTATION_JOB = "grpo.dev/job-full-name"
ROLE_TRAINER = "trainer"
ROLE_VLLM = "vllm-server"
ROLE_INITIALIZER = "initializer"  # the download pod of spec.cache (grpo_trainer/stage.py)

# ---------------------------------------------------------------------------------------------- ports
C10D_PORT = 29400  # torchrun's rendezvous on the rank-0 pod
METRICS_PORT = 9400  # the trainer's Prometheus /metrics (local rank 0 of each node); progress.metricsPort, 0 = off
METRICS_PORT_NAME = "metrics"  # the container port's name: where the operator scrapes

# ---------------------------------------------------------------------------------------------- output
PROGRESS_PREFIX = "GRPO_PROGRESS "  # a progress record on stdout (global rank 0)
# A resumed trainer re-prints its checkpoint's logged steps (each with the attempt that logged it): the pods of earlier
# attempts, and their logs, are gone after a gang restart (`kubectl grpo plot`; grpo_trainer/progress.py)
HISTORY_PREFIX = "GRPO_HISTORY "
ATTEMPT_ENV = "GRPO_ATTEMPT"  # the pod's attempt (grpo.dev/attempt), in the trainer's environment
# runPolicy.restartPolicy InPlace: how many times torchrun's agents restarted this attempt's workers inside their pods
# (grpo_trainer/launch.py sets it for each generation of workers; 0 for the first)
IN_PLACE_RESTARTS_ENV = "GRPO_IN_PLACE_RESTARTS"
# the launcher's line when it starts a new generation of workers (`grpojob run --local` reports it): PREFIX + "N: ..."
IN_PLACE_RESTART_PREFIX = "grpo_trainer.launch: in-place restart "
# a worker's process name (/proc/PID/comm, `ps`): PREFIX + its global rank (grpo_trainer/launch.py)
WORKER_NAME_PREFIX = "grpo-rank-"
# where a process's start went (global rank 0, once, at its first step: grpo_trainer/startup.py)
STARTUP_PREFIX = "GRPO_STARTUP "
RESULT_PREFIX = "GRPO_RESULT "  # the final record, in the pod's termination message
TERMINATION_LOG = "/dev/termination-log"
STAGE_PREFIX = "GRPO_STAGE "  # a staging progress/result record (JSON) on stdout: grpo_trainer/stage.py
STAGE_MODULE = "grpo_trainer.stage"  # `python -m grpo_trainer.stage --config FILE`: the initializer's command
# the download pod's live progress: GET on its `metrics` port answers its last STAGE_PREFIX line (text/plain)
STAGE_PROGRESS_PATH = "/progress"
# spec.cache: the commit staging resolved for each Hub repo, given to the trainer and vLLM pods as JSON
# ([{"kind": "model"|"dataset", "repo": id, "commit": sha}]): they load exactly that commit, never a moving ref such as
# refs/main that another job's staging may rewrite (grpo_trainer/pins.py)
STAGED_REVISIONS_ENV = "GRPO_STAGED_REVISIONS"
# a staged dataset's prepared (Arrow) files: one datasets cache per commit under the datasets cache, so that an offline
# load_dataset, which takes the newest prepared copy it finds, can only find the pinned commit's
DATASET_COMMITS_DIR = "grpo-commits"
TERMINATION_LOG_ENV = "GRPO_TERMINATION_LOG"  # overrides TERMINATION_LOG (tests, local runs)

# ---------------------------------------------------------------------------------------------- phases and stacks
# What each training process is doing (grpo_trainer/phases.py), published per rank on its node's metrics endpoint
PHASE_LOADING, PHASE_GENERATING, PHASE_REWARDS, PHASE_TRAINING = "loading", "generating", "rewards", "training"
PHASE_SAVING, PHASE_WEIGHT_SYNC, PHASE_EVALUATING, PHASE_DONE = "saving", "weight-sync", "evaluating", "done"
PHASES = (PHASE_LOADING, PHASE_GENERATING, PHASE_REWARDS, PHASE_TRAINING, PHASE_SAVING, PHASE_WEIGHT_SYNC,
          PHASE_EVALUATING, PHASE_DONE)
HEARTBEAT_SECONDS = 2.0  # each process's heartbeat thread ticks this often
# While a process loads (phase loading), the bytes in its Hub cache: a download that moves is progress (the operator
# measures the start-up allowance from its last movement, lifecycle/stall.py)
RANK_DOWNLOAD_BYTES = "grpo_trainer_rank_download_bytes"
# The step a process began training at (0, or a resumed checkpoint's): its step past this one proves it trained.
RANK_BEGAN_STEP = "grpo_trainer_rank_began_step"
BEAT_DIR_ENV = "GRPO_BEAT_DIR"  # where a node's processes leave their beat records (default: under the temp dir)
# POST on the metrics port: every process of the pod dumps all its threads' stacks (faulthandler, on STACKS_SIGNAL) to
# <output>/STALLS_DIR/attempt-N/rank-R.txt; the answer is JSON {"ranks": {"R": {"file", "dumped", "stack"}}}
STACKS_PATH = "/stacks"
STACKS_SIGNAL_NAME = "SIGUSR1"
STALLS_DIR = "stalls"

# ---------------------------------------------------------------------------------------------- exit codes
OK = 0

# Permanent (1-127): rerunning the same spec fails the same way.
INTERNAL = 1  # an unexpected exception in the trainer (a bug): traceback on stderr
CONFIG = 10  # the config JSON is unreadable, misses a key, or a GRPOConfig argument is invalid
DATASET = 11  # the dataset cannot be loaded, or the prompt/answer column does not exist
REWARD = 12  # unknown built-in reward, or a custom reward that cannot be imported
BATCH = 13  # TRL's batch arithmetic rejected the spec at this world size (TRL's own message)
MODEL = 14  # the model or tokenizer cannot be loaded (no such path/repo, bad files)
CHECKPOINT = 15  # the checkpoint to resume from exists but cannot be loaded
STORAGE = 16  # the output directory cannot be written (permissions, read-only or full volume)
REMOTE_CODE = 17  # the model (or a reward model) ships its own code and training.trustRemoteCode is not true
HUB_DENIED = 18  # staging: the Hub refused the token (401 gated/private repo without access, 403)
HUB_NOT_FOUND = 19  # staging: no such repo, revision or file on the Hub (404: a typo in spec.model/dataset)

# Retryable (>=128). 128+N is "killed by signal N" (143 = SIGTERM, 137 = SIGKILL e.g. the OOM killer).
SIGNAL_BASE = 128
PREEMPTED = 128 + 15  # SIGTERM received: a checkpoint was saved when possible, then exit 143
DISTRIBUTED = 200  # gloo/NCCL timeout or a lost peer; rendezvous failure (peers never arrived)
ACCELERATOR_OOM = 201  # CUDA out of memory (torch.OutOfMemoryError)
TRANSIENT_IO = 202  # the model/dataset hub or a network file system was unreachable

PERMANENT = {
    INTERNAL: "internal error",
    CONFIG: "config error",
    DATASET: "dataset error",
    REWARD: "reward error",
    BATCH: "batch size error",
    MODEL: "model error",
    CHECKPOINT: "checkpoint error",
    STORAGE: "storage error",
    REMOTE_CODE: "remote code not trusted",
    HUB_DENIED: "hub access denied",
    HUB_NOT_FOUND: "not found on the hub",
}
RETRYABLE = {
    PREEMPTED: "preempted (SIGTERM)",
    DISTRIBUTED: "distributed communication failure",
    ACCELERATOR_OOM: "accelerator out of memory",
    TRANSIENT_IO: "transient I/O failure",
}
# status.lastFailureReason (and the Failed/Restarting condition's reason) of a pod that exited with the code
EXIT_REASONS = {
    INTERNAL: "InternalError",
    CONFIG: "ConfigError",
    DATASET: "DatasetError",
    REWARD: "RewardError",
    BATCH: "BatchError",
    MODEL: "ModelError",
    CHECKPOINT: "CheckpointError",
    STORAGE: "StorageError",
    REMOTE_CODE: "RemoteCodeNotTrusted",
    HUB_DENIED: "HubAccessDenied",
    HUB_NOT_FOUND: "HubNotFound",
    PREEMPTED: "Preempted",
    DISTRIBUTED: "DistributedError",
    ACCELERATOR_OOM: "AcceleratorOutOfMemory",
    TRANSIENT_IO: "TransientIOError",
}


def is_retryable(code: int) -> bool:
    """The operator's rule: 0 is success, 1-127 permanent, 128-255 (and any signal) retryable."""
    return code >= SIGNAL_BASE or code < 0


def exit_reason(code: int) -> str:
    """A failed pod's exit code by name (DatasetError), or ExitCode<N> for a code the trainer does not define."""
    return EXIT_REASONS.get(code, f"ExitCode{code}")
