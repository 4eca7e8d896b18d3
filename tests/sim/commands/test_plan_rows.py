"""``timeshare plan`` on real framework configs: one test per row of what a user met (each failed before its fix).

Runs the real entry point in-process (:func:`refimpl.cli.main`) and reads what a person or a script reads.
"""
import contextlib
import io
import json
import time
from pathlib import Path

import pytest
import yaml

from refimpl.cli import main
from refimpl.cli_errors import EXIT_BAD_INPUT, EXIT_FAILED

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "examples" / "configs"
VERL_FSDP2 = CONFIGS / "verl_fsdp2_qwen2.5-7b_grpo.yaml"
ROLL = CONFIGS / "roll_megatron_qwen3-30b-a3b.yaml"


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse's own usage errors
            rc = exc.code
    assert "Traceback" not in out.getvalue() + err.getvalue()
    return rc, out.getvalue(), err.getvalue()


def plan_json(argv):
    rc, out, err = run(["plan", "--quiet", "--json", *argv])
    assert out, err
    return rc, json.loads(out)["data"]


def one_error_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def write(path, data):
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def verl_ppo_with_a_critic(tmp_path):
    """A verl PPO job (GAE: a critic) on one 8 x H200 node whose rollout is starved of KV cache."""
    return write(tmp_path / "ppo.yaml", {
        "data": {"train_batch_size": 1024, "max_prompt_length": 1024, "max_response_length": 4096},
        "algorithm": {"adv_estimator": "gae"},
        "actor_rollout_ref": {
            "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
            "actor": {"strategy": "fsdp2", "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 16384,
                      "use_kl_loss": True, "fsdp_config": {"param_offload": False, "optimizer_offload": False}},
            "ref": {"fsdp_config": {"param_offload": False}},
            "rollout": {"n": 8, "tensor_model_parallel_size": 1, "gpu_memory_utilization": 0.5}},
        "critic": {"strategy": "fsdp2", "model": {"path": "Qwen/Qwen2.5-7B-Instruct"}},
        "trainer": {"nnodes": 1, "n_gpus_per_node": 8}})


# ---------------------------------------------------------------------------- every offloaded role has its key


def test_every_role_the_plan_offloads_has_its_key_in_the_answer_and_pasting_it_back_holds(tmp_path):
    from sim.planner.plan_config import read_config

    cfg = verl_ppo_with_a_critic(tmp_path)
    rc, data = plan_json([str(cfg), "--layouts", "given"])
    assert rc == 0
    rec, keys = data["recommendation"], data["answer"]["keys"]
    offloaded = rec["offloaded"]  # role -> what the timeline moves out between its turns
    assert "critic" in offloaded and "actor_train" in offloaded, offloaded  # KV-starved: the trained roles go out
    assert any(seg["role"].startswith("critic") and seg["kind"] == "switch" for seg in rec["timeline"])
    # verl 0.9.1's keys for each role (the critic's FSDP engine config is critic.fsdp)
    assert keys["critic.fsdp.param_offload"] is ("params" in offloaded["critic"])
    assert keys["critic.fsdp.optimizer_offload"] is ("optimizer" in offloaded["critic"])
    assert keys["actor_rollout_ref.ref.fsdp_config.param_offload"] is ("reference" in offloaded)
    # paste the answer into the config: every role the timeline offloads is offloaded by the config's own keys
    pasted = yaml.safe_load(cfg.read_text())
    for key, value in keys.items():
        node = pasted
        *head, last = key.split(".")
        for part in head:
            node = node.setdefault(part, {})
        node[last] = value
    again = write(tmp_path / "pasted.yaml", pasted)
    fc = read_config(str(again))
    assert fc.offloads() == {r: set(c) for r, c in offloaded.items()}
    # and re-planning the pasted config answers the same keys: nothing left to change
    rc, data2 = plan_json([str(again), "--layouts", "given"])
    assert rc == 0 and data2["answer"]["changed"] == {}, data2["answer"]["changed"]


def test_verl_answers_only_keys_verl_has_with_the_reward_models_sleep(tmp_path):
    from sim.planner.config_keys import verl_schema
    from sim.planner.plan_config import read_config

    data = yaml.safe_load(VERL_FSDP2.read_text())
    data["reward_model"] = {"enable": True, "model": {"path": "Qwen/Qwen3-4B"}}  # verl's legacy section, migrated
    rc, plan = plan_json([str(write(tmp_path / "rm.yaml", data)), "--layouts", "given", "data.train_batch_size=64"])
    assert rc == 0
    keys = plan["answer"]["keys"]
    assert "reward.reward_model.rollout.free_cache_engine" in keys and plan["inputs"]["workload"]["reward_model"]
    assert all(verl_schema("fsdp").knows(k) for k in keys), keys
    # the config's own legacy key wins in verl's migration, so the answer sets that one
    data["reward_model"]["rollout"] = {"free_cache_engine": False}
    fc = read_config(str(write(tmp_path / "rm2.yaml", data)))
    assert fc.role_keys["reward"] == {"params": "reward_model.rollout.free_cache_engine"}
    rc, plan = plan_json(["--layouts", "given", *VERL_MEGATRON_SCRIPT])
    keys = (plan["answer"] or {}).get("keys") or plan["more_nodes"]["keys"]
    assert not any("grad_offload" in k for k in keys) and all(verl_schema("megatron").knows(k) for k in keys), keys


def test_roll_answers_only_keys_roll_has():
    from sim.planner.config_keys import roll_schema

    rc, data = plan_json([str(ROLL), "--layouts", "given"])
    assert rc == 0
    schema = roll_schema()
    assert all(schema.knows(k) for k in data["answer"]["keys"]), data["answer"]["keys"]


# ---------------------------------------------------------------------------- unknown keys refused


def test_a_typo_in_an_override_is_refused_with_the_close_match():
    rc, _out, err = run(["plan", "--quiet", str(VERL_FSDP2), "actor_rollout_ref.actor.fsdp_config.param_ofload=true"])
    assert rc == EXIT_BAD_INPUT
    line = one_error_line(err)
    assert "actor_rollout_ref.actor.fsdp_config.param_ofload" in line
    assert "did you mean actor_rollout_ref.actor.fsdp_config.param_offload?" in line
    assert "verl 0.9.1" in line


def test_a_key_of_the_other_strategy_is_refused():
    rc, _out, err = run(["plan", "--quiet", str(VERL_FSDP2),
                         "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"])
    assert rc == EXIT_BAD_INPUT
    line = one_error_line(err)
    assert "actor_rollout_ref.actor.megatron.tensor_model_parallel_size" in line
    assert "Megatron trainer config" in line and "the strategy is fsdp2" in line
    assert "did you mean" not in line  # not the FSDP config's nearest key (the rollout's tensor_model_parallel_size)


def test_a_typo_in_the_file_and_in_a_roll_override_are_refused(tmp_path):
    data = yaml.safe_load(VERL_FSDP2.read_text())
    data["actor_rollout_ref"]["actor"]["fsdp_config"]["optimizer_ofload"] = True
    rc, _out, err = run(["plan", "--quiet", str(write(tmp_path / "typo.yaml", data))])
    assert rc == EXIT_BAD_INPUT and "did you mean actor_rollout_ref.actor.fsdp_config.optimizer_offload?" in err
    rc, _out, err = run(["plan", "--quiet", str(ROLL), "is_offload_state=true"])
    assert rc == EXIT_BAD_INPUT and "did you mean is_offload_states?" in one_error_line(err)
    # a key ROLL does not define, one letter off a key the plan reads, is refused in the file too (ROLL ignores it)
    roll = yaml.safe_load(ROLL.read_text())
    roll["rollout_batch_sizes"] = 64
    rc, _out, err = run(["plan", "--quiet", str(write(tmp_path / "roll.yaml", roll))])
    assert rc == EXIT_BAD_INPUT and "did you mean rollout_batch_size?" in one_error_line(err)


def test_plus_adds_a_key_plus_plus_adds_or_sets_and_tilde_deletes_as_hydra_does():
    rc, data = plan_json([str(VERL_FSDP2), "--layouts", "given", "+trainer.my_tag=abc", "++data.train_batch_size=64",
                          "++actor_rollout_ref.actor.fsdp_config.param_offload=false", "~data.max_response_length"])
    assert rc == 0
    w = data["inputs"]["workload"]
    assert (w["prompts"], w["response_len"]) == (64, 512)  # set by ++; deleted by ~: verl's default 512 (not 2,048)
    from sim.planner.plan_config import read_config

    fc = read_config(str(VERL_FSDP2), ["++actor_rollout_ref.actor.fsdp_config.param_offload=false"])
    assert fc.current["actor_rollout_ref.actor.fsdp_config.param_offload"] is False  # the file's true, set by ++
    rc, _out, err = run(["plan", "--quiet", str(VERL_FSDP2), "+data.train_batch_size=64"])
    assert rc == EXIT_BAD_INPUT and "already a key" in one_error_line(err)


# ---------------------------------------------------------------------------- --model over the config's path


def test_model_option_overrides_a_model_path_the_plan_does_not_know(tmp_path):
    data = yaml.safe_load(VERL_FSDP2.read_text())
    data["actor_rollout_ref"]["model"]["path"] = "/models/my-own-7b"
    cfg = write(tmp_path / "mine.yaml", data)
    rc, _out, err = run(["plan", "--quiet", str(cfg)])
    assert rc == EXIT_BAD_INPUT and "--model" in err  # the error says what to do ...
    hf = tmp_path / "config.json"
    hf.write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
                              "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                              "vocab_size": 152064, "model_type": "qwen2"}))
    rc, data = plan_json([str(cfg), "--model", str(hf), "--layouts", "given", "data.train_batch_size=64"])
    assert rc == 0 and data["inputs"]["model"]["source"].startswith(str(hf))  # ... and doing it works


# ---------------------------------------------------------------------------- what drives the memory


def test_a_micro_batch_too_big_is_named_with_its_gib_and_the_key_that_fixes_it(tmp_path):
    data = yaml.safe_load(VERL_FSDP2.read_text())
    actor = data["actor_rollout_ref"]["actor"]
    actor["use_dynamic_bsz"] = False
    actor["ppo_micro_batch_size_per_gpu"] = 80
    rc, plan = plan_json([str(write(tmp_path / "mb80.yaml", data)), "--layouts", "given"])
    assert rc == EXIT_FAILED
    driver = plan["memory_driver"]
    assert driver["biggest"] == "logits" and driver["terms_gib"]["logits"] > 100  # 80 x 3072 tokens x 152064 x 8 B
    reason = plan["reason"]
    assert "fp32 logits over the vocabulary" in reason and f"{driver['terms_gib']['logits']:.1f} GiB" in reason
    fix = plan["answer"]["fix"]
    assert list(fix) == ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] and 1 <= fix[
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] < 80
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=" in reason
    # the fix fits
    key, value = next(iter(fix.items()))
    rc, fixed = plan_json([str(tmp_path / "mb80.yaml"), "--layouts", "given", f"{key}={value}"])
    assert rc == 0 and fixed["recommendation"] is not None


def test_verls_own_grpo_example_as_written_says_the_micro_batch_is_the_cause():
    # examples/grpo_trainer/run_deepseek7b_llm.sh of verl, with `python3 -m verl.trainer.main_ppo` replaced
    args = ["algorithm.adv_estimator=grpo", "data.train_files=/data/gsm8k/train.parquet",
            "data.val_files=/data/gsm8k/test.parquet", "data.train_batch_size=1024", "data.max_prompt_length=512",
            "data.max_response_length=1024", "data.filter_overlong_prompts=True", "data.truncation=error",
            "actor_rollout_ref.model.path=deepseek-ai/deepseek-llm-7b-chat", "actor_rollout_ref.actor.optim.lr=1e-6",
            "actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.actor.ppo_mini_batch_size=256",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=80", "actor_rollout_ref.actor.use_kl_loss=True",
            "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
            "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.model.enable_gradient_checkpointing=True",
            "actor_rollout_ref.actor.fsdp_config.param_offload=False",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=160",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.n=5",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=160",
            "actor_rollout_ref.ref.fsdp_config.param_offload=True", "algorithm.use_kl_in_reward=False",
            "trainer.critic_warmup=0", "trainer.logger=console", "trainer.project_name=verl_grpo_example_gsm8k",
            "trainer.experiment_name=deepseek_llm_7b_function_rm", "trainer.n_gpus_per_node=8", "trainer.nnodes=1",
            "trainer.save_freq=20", "trainer.test_freq=5", "trainer.total_epochs=15"]
    rc, out, err = run(["plan", "--quiet", "--layouts", "given", *args])
    assert rc == EXIT_FAILED, err
    said = " ".join(out.split())  # the answer as read, its lines joined
    assert "fp32 logits over the vocabulary" in said and "122,880 tokens a micro-batch (80 sequences" in said
    assert "102,400 vocabulary" in said and "set actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=" in said
    assert "more GPUs do not shrink it" in said


def test_the_reason_follows_the_numbers_of_the_kv_cache():
    # the README's 2 x H200 example: the recommended candidate's rollout has less KV cache than it needs
    rc, data = plan_json(["--cluster", "calibrated/hgx-h200-8x", "--gpus-per-node", "2", "--dp", "2", "--rollout-s", "3",
                          "--pg-groups", "megatron"])
    rec, need = data["recommendation"], data["inputs"]["kv_need_gib"]
    assert rc == 0 and rec["rollout_gib"] < need
    assert "already has the KV cache it needs" not in data["reason"]
    assert f"{rec['rollout_gib']:.1f} of the {need:.1f} GiB" in data["reason"]
    # and where it has what it needs, the reason says so
    rc, data = plan_json(["--cluster", "h200-1x", "--model", "Qwen3-4B", "--no-reference", "--prompts", "8"])
    rec, need = data["recommendation"], data["inputs"]["kv_need_gib"]
    assert rc == 0 and rec["rollout_gib"] >= need and "has the KV cache it needs" in data["reason"]


# ---------------------------------------------------------------------------- Hydra's command line


VERL_MEGATRON_SCRIPT = [  # examples/grpo_trainer/run_qwen2-7b_math_megatron.sh of verl, its variables filled in
    "--config-path=config", "--config-name=ppo_megatron_trainer.yaml", "algorithm.adv_estimator=grpo",
    "data.train_files=['/data/gsm8k/train.parquet', '/data/math/train.parquet']",
    "data.val_files=['/data/gsm8k/test.parquet', '/data/math/test.parquet']", "data.return_raw_chat=True",
    "data.train_batch_size=1024", "data.max_prompt_length=1024", "data.max_response_length=1024",
    "data.filter_overlong_prompts=True", "data.truncation=error", "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct",
    "actor_rollout_ref.model.use_fused_kernels=True", "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
    "actor_rollout_ref.rollout.n=5", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2", "algorithm.use_kl_in_reward=False",
    "trainer.critic_warmup=0", "trainer.logger=[\"console\",\"wandb\"]",
    "trainer.project_name=verl_grpo_example_gsm8k_math", "trainer.experiment_name=qwen2_7b_megatron",
    "trainer.n_gpus_per_node=8", "trainer.nnodes=1", "trainer.save_freq=20", "trainer.test_freq=5",
    "trainer.total_epochs=15"]


def test_a_verl_megatron_launch_script_as_written_is_planned():
    rc, data = plan_json(["--layouts", "given", *VERL_MEGATRON_SCRIPT])
    assert rc in (0, EXIT_FAILED), data
    lay = data["inputs"]["layout"]
    assert (lay["tp"], lay["pp"], lay["dp"], lay["shard"]) == (2, 2, 2, "optimizer")
    w = data["inputs"]["workload"]
    assert (w["prompts"], w["samples_per_prompt"], w["response_len"]) == (1024, 5, 1024)
    keys = data["answer"]["keys"] if data["answer"] else data["more_nodes"]["keys"]
    assert keys and all(k.startswith(("actor_rollout_ref.", "critic.", "trainer.")) for k in keys)


def test_verl_megatron_offload_keys_are_the_ones_that_move_what_the_timeline_moves():
    """verl 0.9.1's Megatron workers: ``megatron.param_offload`` moves parameters and gradients, ``optimizer_offload``
    the optimizer; there is no ``grad_offload`` (verl 0.8's) in the shipped key data, so the answer never sets it."""
    from sim.planner.config_keys import verl_schema
    from sim.planner.plan_config import expressible, offload_keys, read_config

    a = "actor_rollout_ref"
    schema = verl_schema("megatron")
    assert schema.knows(f"{a}.actor.megatron.param_offload") and schema.knows(f"{a}.actor.megatron.optimizer_offload")
    assert not schema.knows(f"{a}.actor.megatron.grad_offload")
    # a 13B job on 4 GPUs: its rollout is short of KV cache, the trained state goes out between turns
    script = [*VERL_MEGATRON_SCRIPT, "actor_rollout_ref.model.path=meta-llama/Llama-2-13b-hf",
              "trainer.n_gpus_per_node=4", "data.max_response_length=4096"]
    rc, data = plan_json(["--layouts", "given", *script])
    assert rc == 0
    offloaded, keys = data["recommendation"]["offloaded"], data["answer"]["keys"]
    assert set(offloaded["actor_train"]) == {"params", "grads", "optimizer"}, offloaded
    assert keys[f"{a}.actor.megatron.param_offload"] is True and keys[f"{a}.actor.megatron.optimizer_offload"] is True
    assert keys[f"{a}.ref.megatron.param_offload"] is ("reference" in offloaded)
    assert not any("grad_offload" in k for k in keys) and all(schema.knows(k) for k in keys), keys
    # pasted back as overrides, the config offloads what the timeline offloads
    pasted = read_config(None, [*script[2:], *(f"{k}={str(v).lower()}" for k, v in keys.items()
                                               if isinstance(v, bool))], config_path="config",
                         config_name="ppo_megatron_trainer.yaml")
    assert pasted.offloads() == {r: set(c) for r, c in offloaded.items()}
    # each offload verl can express maps onto the keys that move exactly that, and back
    fc = read_config(None, script[2:], config_path="config", config_name="ppo_megatron_trainer.yaml")
    for off in ((), ("params", "grads"), ("optimizer",), ("params", "grads", "optimizer")):
        assert expressible(fc, off, "local", False, "none")
        set_ = offload_keys(fc, {"offload": off, "score_offload": False})
        assert set_[f"{a}.actor.megatron.param_offload"] is ("params" in off)
        assert set_[f"{a}.actor.megatron.optimizer_offload"] is ("optimizer" in off)
        again = read_config(None, [*script[2:], *(f"{k}={str(v).lower()}" for k, v in set_.items())],
                            config_path="config", config_name="ppo_megatron_trainer.yaml")
        assert again.offloads().get("actor_train", set()) == set(off), off
    assert not expressible(fc, ("grads",), "local", False, "none")  # no key moves the gradients alone


def test_config_name_of_a_file_in_config_path_with_a_defaults_list(tmp_path):
    # a user's config beside the script: verl's ppo_trainer first, then its own keys (Hydra's defaults list)
    write(tmp_path / "mine.yaml", {"defaults": ["ppo_trainer", "_self_"],
                                   "actor_rollout_ref": {"model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
                                                         "rollout": {"n": 4}},
                                   "data": {"train_batch_size": 64}, "algorithm": {"adv_estimator": "grpo"}})
    rc, data = plan_json(["--config-path", str(tmp_path), "--config-name", "mine", "--layouts", "given",
                          "data.max_response_length=256"])
    assert rc == 0
    w = data["inputs"]["workload"]
    assert (w["prompts"], w["samples_per_prompt"], w["response_len"], w["prompt_len"]) == (64, 4, 256, 512)
    rc, _out, err = run(["plan", "--quiet", "--config-path", str(tmp_path), "--config-name", "nosuch"])
    assert rc == EXIT_BAD_INPUT and "nosuch" in one_error_line(err)


# ---------------------------------------------------------------------------- sizes checked before anything is built


@pytest.mark.parametrize("argv, words", [
    (["bench", "switch-window", "--dp", "1000000", "--tp", "8"], "8,000,000 ranks"),
    (["bench", "switch-window", "--dp", "1000000", "--tp", "8", "--topology", ""], "131,072"),
    (["plan", "--dp", "1000000", "--tp", "8"], "8,000,000 ranks"),
    (["plan", "--ep", "1000000"], "--ep 1000000"),
    (["plan", "--rollout-tp", "1000000"], "--rollout-tp 1000000"),
], ids=["switch-window", "switch-window-no-topology", "plan-dp", "plan-ep", "plan-rollout-tp"])
def test_mesh_sizes_are_checked_before_anything_is_built(argv, words):
    t0 = time.perf_counter()
    rc, _out, err = run(argv)
    assert rc == EXIT_BAD_INPUT and words in one_error_line(err)
    assert time.perf_counter() - t0 < 10


# ---------------------------------------------------------------------------- candidates that do not fit


def test_candidates_that_do_not_fit_are_an_answer_not_error_logs():
    # the CLI as a user runs it, in its own process: in-process, pytest's log handlers would take the records
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "refimpl", "plan", "--params-b", "400", "--quiet", "--rows", "60"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == EXIT_FAILED, proc.stderr[-2000:]
    err = proc.stderr
    assert "PinningError" not in err and "ERROR" not in err and "WARNING" not in err, err[:2000]
    assert "host pinned memory" in proc.stdout  # the reason is in the answer, once per candidate
    assert "Traceback" not in proc.stdout + err
