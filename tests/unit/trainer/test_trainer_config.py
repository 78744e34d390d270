"""Config contract (docs/trainer-config.md) → GRPOConfig kwargs."""

import json

import pytest

from grpo_trainer import config
from grpo_trainer.exitcodes import CONFIG, TrainerError
from tests.support.trainer import config_doc


def parse(**kw):
    return config.parse(config_doc("/out", **kw))


def test_parse_full_document():
    cfg = parse(rewards=[{"name": "accuracy", "function": None, "weight": 1.0},
                         {"name": None, "function": "my_rewards:score", "weight": 0.5}],
                vllm={"mode": "server", "serverHost": "job-vllm", "serverPort": 8001})
    assert cfg.dataset.prompt_column == "question" and cfg.dataset.answer_column == "answer"
    assert [r.label for r in cfg.rewards] == ["accuracy", "my_rewards:score"]
    assert cfg.vllm.server_host == "job-vllm" and cfg.vllm.server_port == 8001
    assert cfg.output_dir == "/out" and cfg.progress is True


def test_defaults_and_unknown_top_level_keys_ignored():
    doc = config_doc("/out", futureKey={"x": 1})
    del doc["dataset"]["split"], doc["dataset"]["promptColumn"], doc["progress"], doc["job"]
    doc["dataset"]["answerColumn"] = None
    cfg = config.parse(doc)
    assert cfg.dataset.split == "train" and cfg.dataset.prompt_column == "prompt"
    assert cfg.dataset.answer_column is None and cfg.progress is False


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.pop("model"), "missing required key 'model'"),
    (lambda d: d["dataset"].pop("name"), "'dataset.name'"),
    (lambda d: d.update(rewards=[]), "'rewards' is empty"),
    (lambda d: d.update(rewards=[{"name": "accuracy", "function": "a:b"}]), "exactly one of"),
    (lambda d: d.update(rewards=[{"name": None, "function": None}]), "exactly one of"),
    (lambda d: d.update(training=[1]), "'training' must be an object"),
    (lambda d: d["vllm"].update(mode="remote"), "'vllm.mode' is 'remote'"),
    (lambda d: d["vllm"].update(mode="server"), "serverHost"),
    (lambda d: d["vllm"].update(serverPort=True), "'vllm.serverPort' must be an integer"),
    (lambda d: d.update(schemaVersion=2), "schemaVersion 2"),
    (lambda d: d.pop("outputDir"), "'outputDir'"),
])
def test_invalid_documents_are_config_errors(mutate, needle):
    doc = config_doc("/out")
    mutate(doc)
    with pytest.raises(TrainerError) as e:
        config.parse(doc)
    assert e.value.code == CONFIG and needle in e.value.message
    assert "\n" not in e.value.line()


def test_load_unreadable_and_invalid_json(tmp_path):
    with pytest.raises(TrainerError, match="cannot read"):
        config.load(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TrainerError, match="not valid JSON"):
        config.load(str(bad))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(config_doc("/out")))
    assert config.load(str(good)).model.endswith("model")


def test_cpu_kwargs_force_cpu_and_fp32_with_warning():
    warnings = []
    kw = config.grpo_kwargs(parse(training_kw={"bf16": True}), cuda=False, warn=warnings.append)
    assert kw["use_cpu"] is True and kw["bf16"] is False and kw["fp16"] is False
    assert kw["ddp_find_unused_parameters"] is False and kw["use_vllm"] is False
    assert kw["output_dir"] == "/out" and kw["reward_weights"] == [1.0, 0.5]
    assert kw["per_device_train_batch_size"] == 2 and kw["disable_tqdm"] is True
    assert any("bf16" in w for w in warnings)


def test_gpu_colocate_and_server_kwargs():
    kw = config.grpo_kwargs(parse(vllm={"mode": "colocate", "tensorParallelSize": 2, "gpuMemoryUtilization": 0.5}),
                            cuda=True)
    assert kw["use_vllm"] is True and kw["vllm_mode"] == "colocate"
    assert kw["vllm_tensor_parallel_size"] == 2 and kw["vllm_gpu_memory_utilization"] == 0.5
    assert "use_cpu" not in kw and "bf16" not in kw  # TRL's own default on GPU
    kw = config.grpo_kwargs(parse(vllm={"mode": "server", "serverHost": "j-vllm", "serverPort": 8000}), cuda=True)
    assert (kw["vllm_mode"], kw["vllm_server_host"], kw["vllm_server_port"]) == ("server", "j-vllm", 8000)
    kw = config.grpo_kwargs(parse(training_kw={"ddp_find_unused_parameters": True}), cuda=True)
    assert kw["ddp_find_unused_parameters"] is True and kw["use_vllm"] is False


def test_vllm_colocate_on_cpu_is_used_when_installed():
    warnings = []
    kw = config.grpo_kwargs(parse(vllm={"mode": "colocate", "gpuMemoryUtilization": 0.2}), cuda=False,
                            warn=warnings.append, vllm_importable=True)
    assert kw["use_vllm"] is True and kw["vllm_mode"] == "colocate" and kw["use_cpu"] is True
    assert kw["vllm_gpu_memory_utilization"] == 0.2 and not warnings


def test_vllm_not_installed_falls_back_to_transformers_generation():
    warnings = []
    kw = config.grpo_kwargs(parse(vllm={"mode": "colocate"}), cuda=True, warn=warnings.append, vllm_importable=False)
    assert kw["use_vllm"] is False and "vllm_mode" not in kw and "not installed" in warnings[0]


def test_vllm_server_mode_without_cuda_is_a_config_error_before_anything_loads():
    with pytest.raises(TrainerError) as e:
        config.grpo_kwargs(parse(vllm={"mode": "server", "serverHost": "j-vllm"}), cuda=False, vllm_importable=True)
    assert e.value.code == CONFIG and "needs a CUDA GPU" in e.value.message and "colocate" in e.value.message
    assert len(e.value.line().splitlines()) == 1


def test_vllm_cpu_defaults_follow_the_spec_and_leave_user_settings(monkeypatch, tmp_path):
    from grpo_trainer import vllm_support as vs

    gib = vs.GiB
    assert vs.default_kv_cache_gib(0.3, 2, limit_bytes=32 * gib) == 4  # 0.3 of 32 GiB shared by 2 processes
    assert vs.default_kv_cache_gib(0.05, 2, limit_bytes=8 * gib) == 1  # at least 1 GiB
    # (vLLM itself sets TORCHINDUCTOR_CACHE_DIR in os.environ when an earlier test ran an engine in this process)
    for key in (vs.KV_ENV, "VLLM_RPC_BASE_PATH", "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/mine")
    env = vs.cpu_environment(0.3, 1, tmp=str(tmp_path))
    assert "VLLM_CACHE_ROOT" not in env and int(env[vs.KV_ENV]) >= 1
    assert env["VLLM_RPC_BASE_PATH"] == str(tmp_path) and env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path))


@pytest.mark.parametrize("key, needle", [("max_stepz", "unknown GRPOConfig argument(s) max_stepz"),
                                         ("output_dir", "'training.output_dir' is set by the trainer"),
                                         ("reward_weights", "'training.reward_weights'")])
def test_unknown_or_owned_training_keys(key, needle):
    with pytest.raises(TrainerError) as e:
        config.grpo_kwargs(parse(training_kw={key: 1}), cuda=False)
    assert e.value.code == CONFIG and needle in e.value.message


def test_kwargs_construct_a_real_grpo_config(tmp_path):
    from trl import GRPOConfig

    kw = config.grpo_kwargs(config.parse(config_doc(str(tmp_path))), cuda=False)
    args = GRPOConfig(**kw)
    assert args.use_cpu and not args.bf16 and args.num_generations == 2 and args.reward_weights == [1.0, 0.5]
