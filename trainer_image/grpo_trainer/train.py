"""Runs one GRPO job from a TrainerConfig: validate everything cheap first, then build TRL's trainer and train."""

from __future__ import annotations

import os
import sys
from typing import Any

from . import data, lean_imports, pins, resume, rewards
from .config import TrainerConfig, grpo_kwargs
from .exitcodes import (
    BATCH,
    CHECKPOINT,
    CONFIG,
    PREEMPTED,
    TrainerError,
    classify,
    is_retryable,
    is_trl_batch_error,
    storage_error,
)
from .progress import RESULT_PREFIX, ProgressCallback, emit, replay_history, write_final_progress


def log(msg: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        sys.stderr.write(f"grpo_trainer: {msg}\n")
        sys.stderr.flush()


def batch_error(e: BaseException) -> TrainerError:
    """TRL's batch ValueError as exit 13 (BATCH), with TRL's own message and the world size it saw."""
    return TrainerError(BATCH, f"TRL rejected the batch sizes at world size {_world_size()}: {e}")


def build_args(kwargs: dict[str, Any]) -> Any:
    """GRPOConfig for this job; TRL's batch ValueError becomes exit 13 with TRL's own message."""
    from trl import GRPOConfig

    try:
        return GRPOConfig(**kwargs)
    except (ValueError, ZeroDivisionError) as e:
        if is_trl_batch_error(e):
            raise batch_error(e) from None
        raise TrainerError(CONFIG, f"invalid training arguments: {e}") from None
    except TypeError as e:
        raise TrainerError(CONFIG, f"invalid training arguments: {e}") from None


def _announce_vllm(cfg: TrainerConfig, args, cuda: bool) -> None:
    where = "GPU"
    if not cuda:
        from . import vllm_support

        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        vllm_support.prepare_cpu(cfg.vllm.gpu_memory_utilization, local)
        where = (f"CPU ({vllm_support.KV_ENV}={os.environ[vllm_support.KV_ENV]} GiB per process, float32, eager, "
                 "plain linear weights for TRL's weight sync)")
    target = f" at {args.vllm_server_host}:{args.vllm_server_port}" if args.vllm_mode == "server" else ""
    log(f"generating with vLLM, {args.vllm_mode} mode{target}, on {where}")


def check_output_writable(output_dir: str) -> None:
    """Every process writes to the output directory (rank 0 the model, each rank its RNG state): a volume the pod
    cannot write is a storage error now, not a PermissionError at the first checkpoint."""
    probe = os.path.join(output_dir, f".grpo-write-probe-{os.environ.get('RANK', '0')}-{os.getpid()}")
    try:
        os.makedirs(output_dir, exist_ok=True)
        with open(probe, "w", encoding="utf-8") as f:
            f.write("ok\n")
        os.remove(probe)
    except OSError as e:
        raise storage_error(e, output_dir) from None


def plain_cpu_device(args) -> None:
    """Use `cpu`, not `cpu:0`, as the training device on CPU.

    Under torchrun on CPU, accelerate reports the device as `cpu:0`, and transformers 5.17 (the locked version: vLLM 0.31
    caps it below 5.18) resumes the optimizer with `torch.load(map_location=args.device)` when the world size is
    above 1, which torch 2.13 refuses ("don't know how to restore data location ... (tagged with cpu:0)"): every resume
    after a gang restart failed. Both name the same memory; transformers 5.24 stopped passing the device."""
    import torch

    device = args.device
    if device.type == "cpu" and device.index is not None:
        args.__dict__["_setup_devices"] = torch.device("cpu")  # TrainingArguments.device reads this cached property


_CHECKPOINT_LOADERS = ("_load_from_checkpoint", "_load_optimizer_and_scheduler", "_load_scaler", "_load_rng_state",
                       "_load_callback_state")


def guard_checkpoint_loading(trainer, checkpoint: str) -> None:
    """An error while the Trainer loads `checkpoint` (weights, optimizer, scheduler, RNG state) is a checkpoint error
    (exit 15) whatever its wording; a retryable one (a lost peer, a transient read) keeps its own code."""

    def guarded(load):
        def call(*a, **kw):
            try:
                return load(*a, **kw)
            except TrainerError:
                raise
            except Exception as e:
                known = classify(e)
                if known is not None and is_retryable(known.code):
                    raise
                text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise TrainerError(CHECKPOINT, f"cannot resume from {checkpoint}: {type(e).__name__}: {text}; delete "
                                               "that checkpoint directory to resume from an earlier one") from e
        return call

    for name in _CHECKPOINT_LOADERS:
        load = getattr(trainer, name, None)
        if load is not None:
            setattr(trainer, name, guarded(load))


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def run(cfg: TrainerConfig) -> tuple[int, object]:
    """Train; return (exit code, trainer). Raises TrainerError for permanent errors found before training."""
    import torch

    from . import startup

    start = startup.StartClock()
    start.mark("imports")
    cuda = torch.cuda.is_available()
    # 0. Metrics first (local rank 0 of each node): the operator finds the rank-0 pod while the model loads.
    from . import metrics as metrics_mod
    from . import phases

    hub = phases.hub_folders(cfg.model, *(r.model for r in cfg.rewards), datasets=(cfg.dataset.name,))
    clock = phases.start(hub)  # every rank: its phase, heartbeat and, while it loads, its Hub download's bytes
    metrics = metrics_mod.start(cfg.metrics_port, cfg.job_name, cfg.job_namespace, clock.directory or "")
    # 1.-2. Cheap checks, then GRPOConfig (TRL's batch check with the real world size).
    tokenizer, reward_funcs, splits, args, revision, trust = _prepare(cfg, cuda)
    start.mark("prepare")
    phases.register(clock, cfg.output_dir)  # its stacks on a signal, into the output volume the checks found good
    # 3. The checkpoint to resume from; a job restarted after it already reached max_steps only re-saves the model
    #    (resuming at max_steps would make transformers train one more step).
    checkpoint = resume.latest_checkpoint(cfg.output_dir)
    if checkpoint and 0 < args.max_steps <= resume.step_of(checkpoint):
        _save_finished(cfg, args, tokenizer, checkpoint, trust)
        return 0, None
    # Before TRL's trainer module is imported: it imports trackio, which reads TRACKIO_DIR once, at import.
    _tracking_and_history(cfg, args, checkpoint)
    # 4. The model and the trainer (vLLM's CPU settings go in before TRL imports vLLM).
    #    The policy goes to TRL as its id, as TRL's grpo.py does: TRL loads it with model_init_kwargs (dtype,
    #    attn_implementation, revision, trust_remote_code) after GRPOConfig, like the reference model.
    grpo_trainer_class = _import_trl(cfg, args, cuda, revision)
    start.mark("trl")
    from . import preemption as preempt

    if preempt.requested():
        log("SIGTERM during setup: exiting 143 (retryable) before training")
        return PREEMPTED, None
    preemption = preempt.PreemptionCallback()
    callbacks: list[Any] = [preemption, phases.callback(clock), startup.callback(start)]
    progress = ProgressCallback(print_lines=cfg.progress, metrics=metrics) \
        if cfg.progress or metrics is not None else None
    if progress is not None:
        callbacks.append(progress)
    trainer = _make_trainer(grpo_trainer_class, cfg, args, tokenizer, reward_funcs, splits, callbacks)
    phases.instrument(trainer, clock)
    start.mark("model")
    if checkpoint:
        log(f"resuming from {checkpoint}")
        guard_checkpoint_loading(trainer, checkpoint)
    trainer.train(resume_from_checkpoint=checkpoint)
    if preemption.stopped:
        log(f"SIGTERM: stopped at step {trainer.state.global_step}"
            + (", checkpoint saved" if trainer.state.global_step > 0 else "") + "; exiting 143 (retryable)")
        return PREEMPTED, trainer
    _save_trained(cfg, trainer, tokenizer, progress.last if progress is not None else {}, checkpoint)
    clock.set(phases.C.PHASE_DONE)
    return 0, trainer


def _import_trl(cfg: TrainerConfig, args: Any, cuda: bool, revision: str | None) -> Any:
    """vLLM's settings (CPU, the pinned revision) in place, the modules this job does not use hidden, then TRL's
    trainer module imported; its GRPOTrainer class."""
    if args.use_vllm:
        _announce_vllm(cfg, args, cuda)
        if revision:
            from . import vllm_support

            vllm_support.pin_revision(revision)
    hidden = lean_imports.hide(lean_imports.unused(args.use_vllm, args.report_to))
    if hidden:
        log(f"not loading {', '.join(hidden)} (this job does not use them)")
    from trl import GRPOTrainer

    return GRPOTrainer


def _make_trainer(grpo_trainer_class: Any, cfg: TrainerConfig, args: Any, tokenizer: Any, reward_funcs: list[Any],
                  splits: tuple[Any, Any], callbacks: list[Any]) -> Any:
    """TRL's GRPOTrainer for this job; TRL's batch ValueError (or ZeroDivisionError) becomes exit 13."""
    train_dataset, eval_dataset = splits  # the eval dataset or None
    try:
        return grpo_trainer_class(model=cfg.model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                                  eval_dataset=eval_dataset, processing_class=tokenizer, callbacks=callbacks,
                                  reward_processing_classes=rewards.processing_classes(reward_funcs),
                                  peft_config=cfg.peft.lora_config() if cfg.peft is not None else None)
    except (ValueError, ZeroDivisionError) as e:
        if is_trl_batch_error(e):
            raise batch_error(e) from None
        raise


def _tracking_and_history(cfg: TrainerConfig, args: Any, checkpoint: str | None) -> None:
    """Where the report_to integrations write and which run they continue (tracking.py); on resume, the checkpoint's
    logged steps re-printed (global rank 0) for `kubectl grpo plot`: the earlier attempts' pods and logs are gone."""
    from . import tracking

    for key, value in tracking.apply(args.report_to or [], cfg.output_dir, cfg.job_uid).items():
        log(f"tracking: {key}={value}")
    if checkpoint and cfg.progress and args.process_index == 0:
        replay_history(checkpoint)


def _prepare(cfg: TrainerConfig, cuda: bool) -> tuple[Any, Any, Any, Any, Any, bool]:
    """Steps 1-2 of run(): the checks that need no model (output volume, argument names, the model's config and
    whether it ships code, rewards import, tokenizer, dataset columns), then GRPOConfig. Returns (tokenizer, reward
    functions, (train dataset, eval dataset or None), GRPOConfig, the model's revision, trust_remote_code)."""
    check_output_writable(cfg.output_dir)
    kwargs = grpo_kwargs(cfg, cuda=cuda)
    from trl import GRPOConfig

    max_len = int(kwargs.get("max_completion_length") or GRPOConfig.max_completion_length or 512)
    init_kwargs = kwargs["model_init_kwargs"]
    staged = pins.from_env()  # spec.cache: the commits this job's staging recorded, for every load below and TRL's
    if ("model", cfg.model) in staged:
        init_kwargs["revision"] = pins.model_revision(staged, cfg.model)
        pins.pin_trl_config(cfg.model, init_kwargs["revision"])
    revision, trust = init_kwargs.get("revision"), init_kwargs["trust_remote_code"]
    data.check_model_config(cfg.model, revision=revision, trust_remote_code=trust)
    reward_funcs = rewards.build(cfg.rewards, max_completion_length=max_len,
                                 answer_column=cfg.dataset.answer_column, init_kwargs=init_kwargs, pins=staged)
    tokenizer = data.load_tokenizer(cfg.model, revision=revision, trust_remote_code=trust)
    chat = data.has_chat_template(tokenizer)
    raw = data.load_dataset(cfg.dataset, cache_dir=pins.dataset_cache_dir(staged, cfg.dataset.name))
    train_dataset = data.prepare_dataset(raw, cfg.dataset, chat=chat)
    eval_spec = cfg.dataset.eval_spec()  # spec.dataset.evalSplit: GRPOTrainer's eval_dataset, same columns
    eval_dataset = data.prepare_dataset(
        data.load_dataset(eval_spec, cache_dir=pins.dataset_cache_dir(staged, eval_spec.name)), eval_spec,
        chat=chat) if eval_spec else None
    # GRPOConfig runs TRL's batch check with the real world size (and initialises the process group).
    args = build_args(kwargs)
    plain_cpu_device(args)
    return tokenizer, reward_funcs, (train_dataset, eval_dataset), args, revision, bool(trust)


def _save_finished(cfg: TrainerConfig, args: Any, tokenizer: Any, checkpoint: str, trust: bool) -> None:
    """A restart after the job already reached max_steps: re-save the checkpoint's model, report, no training."""
    log(f"{checkpoint} already reached max_steps={args.max_steps}; saving its model, no training")
    if args.process_index == 0:
        data.load_model(checkpoint, trust_remote_code=trust).save_pretrained(cfg.output_dir)
        tokenizer.save_pretrained(cfg.output_dir)
        if cfg.progress:
            replay_history(checkpoint)
            emit_result(cfg, resume.step_of(checkpoint), args.max_steps, None, checkpoint, checkpoint)


def _save_trained(cfg: TrainerConfig, trainer: Any, tokenizer: Any, last: dict[str, Any],
                  resumed_from: str | None) -> None:
    trainer.save_model(cfg.output_dir)
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(cfg.output_dir)
        log(f"saved the LoRA adapter (not merged; base model {cfg.model}) to {cfg.output_dir}" if cfg.peft is not None
            else f"saved the model to {cfg.output_dir}")
        # The pod's termination message carries the final progress: the operator's last scrape may be a few
        # steps behind the end, and a finished job should say where it finished.
        write_final_progress(last, trainer.state.global_step, trainer.state.max_steps)
        if cfg.progress:
            emit_result(cfg, trainer.state.global_step, trainer.state.max_steps, last.get("reward"),
                        resume.latest_checkpoint(cfg.output_dir), resumed_from)


def emit_result(cfg: TrainerConfig, step: int, max_steps: int, reward: Any, checkpoint: str | None,
                resumed_from: str | None) -> None:
    """The result line (RESULT_PREFIX + JSON) on stdout: what `grpojob run --local` reports at the end."""
    emit(RESULT_PREFIX, {"step": step, "maxSteps": max_steps, "reward": reward, "outputDir": cfg.output_dir,
                         "checkpoint": checkpoint, "resumedFrom": resumed_from})
