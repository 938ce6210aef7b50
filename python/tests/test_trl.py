"""A real TRL run: `GRPOTrainer(rollout_func=trl_rollout_func(...))` trains a tiny
Qwen2 written by transformers' `save_pretrained` for 3 optimiser steps on the CPU,
with the engine serving the trainer's weights after every step.

Needs torch, transformers 5, trl and datasets: tests/trl_tests.rs runs this file in
the venv `.ci/run` makes for it (TREEGRPO_REQUIRE_TRL=1 there turns a missing
package into a failure); elsewhere it is skipped.
"""

import json
import os
from pathlib import Path

import pytest

import treegrpo
from treegrpo import adapters

try:
    import datasets
    import tokenizers
    import torch
    import transformers
    import trl
except ImportError as e:  # pragma: no cover - depends on the venv
    if os.environ.get("TREEGRPO_REQUIRE_TRL"):
        raise
    pytest.skip(
        f"needs torch, transformers, trl and datasets ({e}); tests/trl_tests.rs runs it in "
        "the venv .ci/run makes",
        allow_module_level=True,
    )

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CALC = Path(__file__).resolve().parents[2] / "data" / "calc" / "train.jsonl"
QUESTIONS = [json.loads(line)["question"] for line in CALC.read_text().splitlines()[:8]]
# trees=2, expand=2, rounds=1: 2 * (1 + 2 * 1) = 6 leaves per prompt.
SHAPE = dict(trees=2, expand=2, rounds=1, max_turns=1, max_step_tokens=8, seed=11)
LEAVES = 6


class AlnumTask:
    """Two steps: any first action gets an observation back; the second ends the
    episode with the share of ASCII letters and digits in it as the reward. A random
    tiny model never answers a calc question (its rewards, and so its advantages,
    would all be 0 and the policy gradient nothing); this share differs between leaves."""

    stop = ["</answer>"]

    def reset(self, sample):
        self.turn = 0
        return [{"role": "user", "content": sample["question"]}]

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            return "\n<result>now answer</result>\n", False, 0.0
        alnum = sum(c.isascii() and c.isalnum() for c in action)
        return None, True, alnum / max(1, len(action))


def tree_advantage(prompts, completions, advantage, **_):
    """The reward function that hands Tree-GRPO's advantages to TRL's loss."""
    return advantage


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
    """A tiny Qwen2 (θ = 1e6, tied embeddings) and a byte-level BPE tokenizer
    trained on the calc questions, both written by transformers' save_pretrained."""
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([CALC.read_text()], trainer)
    hf_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    hf_tok.chat_template = CHATML
    hf_tok.save_pretrained(folder)
    config = transformers.Qwen2Config(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():  # livelier than the 0.02-std init: leaves that differ
        model.model.embed_tokens.weight.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    return folder, hf_tok


def hf_logprobs(model, prompt_ids, completion_ids):
    """The HF model's log-probability of each completion token after its prefix."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    n = len(prompt_ids)
    positions = torch.arange(n - 1, n - 1 + len(completion_ids))
    return logp[positions, torch.tensor(completion_ids)]


def assert_engine_matches(engine, model, tokenizer):
    """Sampled at temperature 1, the engine's logprobs are the model's own."""
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, return_dict=True)["input_ids"]
        for q in QUESTIONS[:2]
    ]
    for prompt, g in zip(prompts, engine.generate(prompts, max_tokens=12, temperature=1.0, seed=5)):
        assert len(g.token_ids) > 0
        theirs = hf_logprobs(model, list(prompt), g.token_ids)
        ours = torch.tensor(g.logprobs)
        assert torch.allclose(ours, theirs, atol=1e-4), (ours - theirs).abs().max()


def test_the_engine_serves_a_transformers_qwen2_as_hf_computes_it(tiny_qwen2):
    folder, tokenizer = tiny_qwen2
    engine = treegrpo.Engine(folder, kv_mib=64)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert_engine_matches(engine, model, tokenizer)
    # Its own state dict (lm_head tied to the embedding) serves the same.
    engine.load_state_dict(model.state_dict())
    assert_engine_matches(engine, model, tokenizer)


def test_tree_advantages_pass_trls_group_mean_unchanged(tiny_qwen2):
    folder, _ = tiny_qwen2
    engine = treegrpo.Engine(folder, kv_mib=64)
    func = adapters.trl_rollout_func(
        engine, AlnumTask, lambda q: {"question": q}, sync_weights=False, **SHAPE
    )
    prompts = [q for q in QUESTIONS[:3] for _ in range(LEAVES)]
    out = func(prompts, None)
    advantages = torch.tensor(out["advantage"], dtype=torch.float32)
    assert advantages.abs().max() > 0.1  # the leaves' rewards differ
    # TRL's GRPO advantage with scale_rewards="none": reward minus its group's mean.
    group_mean = advantages.view(-1, LEAVES).mean(dim=1).repeat_interleave(LEAVES)
    assert torch.allclose(advantages - group_mean, advantages, atol=1e-6)
    assert group_mean.abs().max() < 1e-6


def test_the_built_in_calc_task_fills_trls_rows(tiny_qwen2):
    folder, _ = tiny_qwen2
    engine = treegrpo.Engine(folder, kv_mib=64)
    samples = {s["question"]: s for s in map(json.loads, CALC.read_text().splitlines()[:2])}
    func = adapters.trl_rollout_func(engine, "calc", samples.__getitem__, sync_weights=False, **SHAPE)
    prompts = [q for q in samples for _ in range(LEAVES)]
    out = func(prompts, None)
    assert {k: len(v) for k, v in out.items()} == {k: len(prompts) for k in out}
    assert all(len(ids) > 0 for ids in out["completion_ids"])
    assert all(0.0 <= r <= 1.0 for r in out["reward"])
    assert set(out["weight_version"]) == {0}
    assert out["prompt_ids"][0] != out["prompt_ids"][LEAVES]


def test_a_leaf_count_that_is_not_num_generations_names_the_shapes_that_fit(tiny_qwen2):
    folder, _ = tiny_qwen2
    engine = treegrpo.Engine(folder, kv_mib=64)
    func = adapters.trl_rollout_func(engine, AlnumTask, lambda q: {"question": q}, **SHAPE)

    class Trainer:  # what the function reads of a GRPOTrainer
        num_generations = 4

    with pytest.raises(ValueError, match=r"num_generations is 4.*trees=1, expand=3, rounds=1.*chains=4"):
        func([QUESTIONS[0]] * 4, Trainer())


def test_grpo_trainer_trains_through_the_engine_for_three_steps(tiny_qwen2, tmp_path):
    folder, tokenizer = tiny_qwen2
    engine = treegrpo.Engine(folder, kv_mib=64)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    inner = adapters.trl_rollout_func(engine, AlnumTask, lambda q: {"question": q}, sync_weights=True, **SHAPE)
    calls = []

    def rollout_func(prompts, trainer):
        out = inner(prompts, trainer)
        calls.append({"step": trainer.state.global_step, "engine": engine.weight_version, **out})
        return out

    scored = []

    class Recorder(trl.GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            scored.append(out["advantages"].detach().clone())
            return out

    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        max_steps=3,
        per_device_train_batch_size=LEAVES,
        num_generations=LEAVES,
        gradient_accumulation_steps=1,
        learning_rate=1e-2,
        beta=0.0,
        scale_rewards="none",
        max_completion_length=64,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        bf16=False,
        seed=0,
    )
    trainer = Recorder(
        model=model,
        reward_funcs=tree_advantage,
        args=args,
        train_dataset=datasets.Dataset.from_dict({"prompt": QUESTIONS}),
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )
    trainer.train()

    assert trainer.state.global_step == 3
    assert [c["step"] for c in calls] == [0, 1, 2]
    # A sync before every rollout: the policy after k steps is served as version k+1.
    assert [c["engine"] for c in calls] == [1, 2, 3]
    assert [set(c["weight_version"]) for c in calls] == [{1}, {2}, {3}]
    # TRL's advantages are Tree-GRPO's: its group mean of a forest's advantages is 0.
    assert len(scored) == 3
    for c, adv in zip(calls, scored):
        assert adv.abs().max() > 0.1
        assert torch.allclose(adv, torch.tensor(c["advantage"], dtype=torch.float32), atol=1e-5)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    moved = max((v - start[k]).abs().max().item() for k, v in model.state_dict().items())
    assert moved > 1e-4
    # A last sync (the next rollout would make it) serves the trained weights.
    inner([QUESTIONS[0]] * LEAVES, trainer)
    assert engine.weight_version == 4
    model.eval()
    assert_engine_matches(engine, model, tokenizer)


def test_a_transformers_llama_with_llama3_rope_scaling_serves_as_hf_computes_it(tiny_qwen2, tmp_path):
    """Llama 3.1's frequency scaling, written by transformers 5 (`rope_parameters`),
    with an original context short enough (64) that the tiny head's frequencies fall
    in all three of its bands: the engine's logprobs are HF's own."""
    _, tokenizer = tiny_qwen2
    folder = tmp_path / "tiny-llama3"
    tokenizer.save_pretrained(folder)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_theta=5e5,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    written = json.loads((folder / "config.json").read_text())
    scaling = written.get("rope_parameters") or written.get("rope_scaling")
    assert scaling["rope_type"] == "llama3"
    engine = treegrpo.Engine(folder, kv_mib=64)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert_engine_matches(engine, model, tokenizer)
