"""Engine, sessions and tokenizer against their oracles: the CLI's single-sequence
path, a fresh recompute, and the engine's own counters."""

import subprocess
import threading
import time

import pytest

import treegrpo

PROMPT = "The capital of France is"


def test_greedy_generate_equals_the_cli(engine, treegrpo_bin):
    cli = subprocess.run(
        [treegrpo_bin, "generate", "--raw", "--prompt", PROMPT, "--max-tokens", "24"],
        check=True,
        capture_output=True,
        text=True,
    )
    ids = engine.tokenizer.encode(PROMPT)
    [by_ids] = engine.generate([ids], max_tokens=24)
    [by_text] = engine.generate([PROMPT], max_tokens=24)
    assert by_ids.text == cli.stdout[:-1]  # the CLI prints a newline after the text
    assert by_ids.token_ids == by_text.token_ids
    assert len(by_ids.logprobs) == len(by_ids.token_ids) > 0
    assert by_ids.finish_reason in ("stop", "length")
    assert by_ids.weight_version == engine.weight_version == 0
    assert engine.tokenizer.decode(by_ids.token_ids) == by_ids.text


def test_a_batch_equals_each_prompt_alone(engine):
    prompts = [PROMPT, "def fibonacci(n):", "Once upon a time"]
    together = engine.generate(prompts, max_tokens=12)
    alone = [engine.generate([p], max_tokens=12)[0] for p in prompts]
    for t, a in zip(together, alone):
        assert t.token_ids == a.token_ids
        assert t.logprobs == a.logprobs  # bit-identical: batch-invariant kernels


def test_fork_then_generate_equals_a_fresh_session_and_reuses_the_prefix(engine):
    ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Name a colour."}])
    with engine.session(ids) as parent:
        parent.generate(max_tokens=6)
        tokens = parent.tokens
        before = engine.stats()["counters"]
        [child] = parent.fork(1)
        forked = child.generate(max_tokens=10)
        after = engine.stats()["counters"]
        child.close()
    # The fork computed its own new tokens only: the prefix was reused, not prefilled.
    assert after["reused_fork"] - before["reused_fork"] >= len(tokens) - 1
    assert after["prefilled"] - before["prefilled"] <= 1
    engine.reset_prefix_cache()
    with engine.session(tokens) as fresh:
        recomputed = fresh.generate(max_tokens=10)
    assert forked.token_ids == recomputed.token_ids
    assert forked.logprobs == recomputed.logprobs


def test_fork_computes_the_parents_last_token_once_for_every_branch(engine):
    ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Name a fruit."}])
    with engine.session(ids) as parent:
        parent.generate(max_tokens=5)
        tokens = parent.tokens
        before = engine.stats()["counters"]
        children = parent.fork(3)
        after = engine.stats()["counters"]
        for child in children:
            assert child.tokens == tokens
            child.close()
    # Each branch inherits every token of the session, the last sampled one included
    # (computed once by the fork, not once per branch).
    assert after["reused_fork"] - before["reused_fork"] == 3 * len(tokens)


def test_session_append_and_tokens(engine):
    tok = engine.tokenizer
    with engine.session(tok.encode("Hello")) as s:
        g = s.generate(max_tokens=4)
        extra = tok.encode(" and then", add_special_tokens=False)
        s.append(extra)
        assert s.tokens[-len(extra):] == extra
        assert s.tokens[: len(tok.encode("Hello"))] == tok.encode("Hello")
        assert g.token_ids == s.tokens[len(tok.encode("Hello")) : len(tok.encode("Hello")) + len(g)]
    assert s.closed
    with pytest.raises(ValueError, match="closed"):
        s.generate()


def test_a_collected_session_is_freed(engine):
    s = engine.session(engine.tokenizer.encode(PROMPT))
    assert engine.stats()["sequences"] == 1
    del s
    for _ in range(100):
        if engine.stats()["sequences"] == 0:
            break
        time.sleep(0.01)
    assert engine.stats()["sequences"] == 0


def test_chat_template(engine):
    msgs = [{"role": "user", "content": "Hi"}]
    text = engine.tokenizer.apply_chat_template(msgs, tokenize=False)
    assert "Hi" in text and text.endswith("assistant\n")
    without = engine.tokenizer.apply_chat_template(msgs, add_generation_prompt=False, tokenize=False)
    assert text.startswith(without) and len(without) < len(text)
    assert engine.tokenizer.apply_chat_template(msgs) == engine.tokenizer.encode(text)


def test_sixteen_asyncio_tasks_share_engine_steps(engine):
    import asyncio

    ids = engine.tokenizer.encode(PROMPT)

    async def main():
        return await asyncio.gather(
            *[
                engine.agenerate(ids, {"temperature": 1.0, "max_tokens": 16}, f"req-{i}")
                for i in range(16)
            ]
        )

    before = engine.stats()["counters"]["steps"]
    outs = asyncio.run(main())
    steps = engine.stats()["counters"]["steps"] - before
    generated = sum(len(o.token_ids) for o in outs)
    assert all(o.extra_fields["weight_version"] == engine.weight_version for o in outs)
    assert all(len(o.token_ids) == len(o.log_probs) for o in outs)
    assert all(o.stop_reason == "completed" for o in outs)
    # Batched: far fewer engine steps than tokens generated (one step per token alone).
    assert steps < generated / 4, (steps, generated)
    # A request id names its sampling stream: the same id samples the same tokens.
    async def one():
        return await engine.agenerate(ids, {"temperature": 1.0, "max_tokens": 16}, "req-3")

    again = asyncio.run(one())
    assert again.token_ids == outs[3].token_ids


def test_the_gil_is_released_while_the_engine_works(engine):
    ticks = 0
    stop = threading.Event()

    def count():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    start = ticks
    engine.generate([PROMPT], max_tokens=48)
    during = ticks - start
    stop.set()
    t.join()
    # With the GIL held the counting thread could not have run at all meanwhile.
    assert during > 20, during


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda e: e.generate([[]]), ValueError),
        (lambda e: e.generate([[10**9]]), ValueError),
        (lambda e: e.generate([[-1]]), ValueError),
        (lambda e: e.generate([PROMPT], max_tokens=0), ValueError),
        (lambda e: e.generate([PROMPT], temperature=-1.0), ValueError),
        (lambda e: e.generate([PROMPT], temperature=1.0, top_p=1.5), ValueError),
        (lambda e: e.generate([PROMPT], stop=[""]), ValueError),
        (lambda e: e.generate([PROMPT], max_tokens=4, min_tokens=5), ValueError),
        # Would round to 0.0 (greedy) as an f32: refused, not silently greedy.
        (lambda e: e.generate([PROMPT], temperature=1e-50), ValueError),
        (lambda e: e.generate([PROMPT], temperature=1e39), ValueError),
        (lambda e: e.generate(42), ValueError),
        (lambda e: e.session([]), ValueError),
        (lambda e: e.tokenizer.decode([10**9]), ValueError),
        (lambda e: e.tokenizer.apply_chat_template([{"role": "user"}]), ValueError),
        (lambda e: e.load_weights("/nonexistent/checkpoint"), (FileNotFoundError, ValueError)),
    ],
)
def test_bad_input_raises_and_the_engine_keeps_serving(engine, call, error):
    with pytest.raises(error):
        call(engine)
    [g] = engine.generate([PROMPT], max_tokens=2)
    assert len(g.token_ids) >= 1


def test_min_tokens_holds_off_stop_strings_and_the_end_of_sequence(engine):
    [free] = engine.generate([PROMPT], max_tokens=24)
    first = engine.tokenizer.decode(free.token_ids[:1])
    [early] = engine.generate([PROMPT], max_tokens=24, stop=[first])
    assert len(early.token_ids) == 1 and early.finish_reason == "stop"
    # A stop string counts only once more than min_tokens tokens are generated.
    [held] = engine.generate([PROMPT], max_tokens=24, stop=[first], min_tokens=6)
    assert len(held.token_ids) > 6
    assert held.token_ids[:6] == free.token_ids[:6]  # greedy: the same choices
    # The end-of-sequence tokens cannot be drawn before min_tokens: all 40 come.
    [full] = engine.generate([PROMPT], max_tokens=40, min_tokens=40)
    assert len(full.token_ids) == 40 and full.finish_reason == "length"
    with pytest.raises(ValueError, match="min_tokens"):
        import asyncio

        asyncio.run(engine.agenerate([1, 2, 3], {"max_tokens": 2, "min_tokens": 3}))


def test_bad_sampling_params_in_agenerate(engine):
    import asyncio

    with pytest.raises(ValueError, match="unsupported key"):
        asyncio.run(engine.agenerate([1, 2, 3], {"best_of": 4}))
    # vLLM's penalties are served; out of range they are refused, named.
    with pytest.raises(ValueError, match="repetition_penalty"):
        asyncio.run(engine.agenerate([1, 2, 3], {"repetition_penalty": 0.0}))
    with pytest.raises(ValueError, match="min_p"):
        asyncio.run(engine.agenerate([1, 2, 3], {"min_p": 1.5}))


def test_a_missing_model_is_a_clear_error():
    with pytest.raises((FileNotFoundError, ValueError), match="nonexistent"):
        treegrpo.Engine(model="/nonexistent/model.gguf")


def test_ctrl_c_interrupts_a_long_generate_and_the_engine_goes_on(engine, sigint_raises):
    import _thread

    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    started = time.monotonic()
    # Counting goes on for thousands of tokens (greedy, the default model), where
    # PROMPT's answer ends at EOS in well under the half second a fast CPU needs.
    counting = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
    with pytest.raises(KeyboardInterrupt):
        engine.generate([counting] * 4, max_tokens=4000)
    waited = time.monotonic() - started
    timer.cancel()
    # The interrupted work released its sequences.
    for _ in range(100):
        if engine.stats()["sequences"] == 0:
            break
        time.sleep(0.01)
    assert engine.stats()["sequences"] == 0
    [g] = engine.generate([PROMPT], max_tokens=4)
    assert len(g.token_ids) >= 1
    assert waited < 60  # generous: 4000 tokens x 4 would take minutes


def test_vllm_extensions_alternatives_and_penalties(engine):
    """logprobs=N alternatives are the best of the reported distribution, the sampled
    token's logprob among them when it is the argmax; a repetition penalty changes a
    greedy continuation of a repetitive prompt; bad values are ValueErrors."""
    prompt = [40, 41, 42, 43] * 6
    plain = engine.generate([prompt], max_tokens=8, temperature=0.0, logprobs=3)[0]
    assert len(plain.top_logprobs) == len(plain.token_ids)
    for token, logprob, alternatives in zip(plain.token_ids, plain.logprobs, plain.top_logprobs):
        assert len(alternatives) == 3
        values = [lp for _, lp in alternatives]
        assert values == sorted(values, reverse=True)
        # Greedy: the sampled token is the most likely one, with the same logprob.
        assert alternatives[0][0] == token
        assert abs(alternatives[0][1] - logprob) < 1e-6
    penalised = engine.generate([prompt], max_tokens=8, temperature=0.0, repetition_penalty=1.8)[0]
    assert penalised.token_ids != plain.token_ids
    with pytest.raises(ValueError, match="repetition_penalty"):
        engine.generate([prompt], max_tokens=2, repetition_penalty=0.0)
    with pytest.raises(ValueError, match="min_p"):
        engine.generate([prompt], max_tokens=2, temperature=1.0, min_p=2.0)
    with pytest.raises(ValueError, match="temperature"):
        engine.generate([prompt], max_tokens=2, temperature=-1.0)
