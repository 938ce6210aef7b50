"""The `openai` package against a live `treegrpo serve` (run by
tests/serve_default_model_tests.rs, which starts the server and compares the report
this prints with `treegrpo generate --raw`).

    python openai_client_check.py BASE_URL PROMPT_IDS_JSON

Checks what a trainer's client relies on: the response objects parse, vLLM's
`return_token_ids` extension comes through `extra_body`, streaming deltas add up to
the whole reply, usage counts cached tokens, and a bad request raises the client's
`BadRequestError`. Prints one JSON report on stdout.
"""

import json
import sys

import openai


def main() -> None:
    base_url, prompt_ids = sys.argv[1], json.loads(sys.argv[2])
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    report = {}

    models = client.models.list()
    model = models.data[0].id
    report["model"] = model

    # Greedy completion on token ids, with the token ids returned.
    done = client.completions.create(
        model=model,
        prompt=prompt_ids,
        max_tokens=16,
        temperature=0,
        logprobs=1,
        extra_body={"return_token_ids": True},
    )
    choice = done.choices[0]
    extra = choice.model_extra or {}
    assert extra.get("prompt_token_ids") == prompt_ids, extra
    report["completion_token_ids"] = extra["token_ids"]
    report["completion_text"] = choice.text
    assert len(choice.logprobs.token_logprobs) == len(extra["token_ids"])
    assert all(lp <= 0 for lp in choice.logprobs.token_logprobs)
    assert done.usage.completion_tokens == len(extra["token_ids"])

    # Chat with the model's own template.
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=32, logprobs=True
    )
    reply = chat.choices[0].message.content
    report["chat"] = reply
    assert chat.choices[0].message.role == "assistant"
    content = chat.choices[0].logprobs.content
    assert content and all(isinstance(t.token, str) and t.logprob <= 0 for t in content)

    # The same request streamed: the deltas add up to the whole reply.
    pieces, finish = [], None
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    assert "".join(pieces) == reply, (pieces, reply)
    assert finish == chat.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == chat.usage.completion_tokens

    # The second identical chat prompt finds its full blocks in the prefix cache. The
    # prompt is longer than a KV block (64 positions), so it has whole blocks to share.
    long_messages = [
        {
            "role": "user",
            "content": "Read this and say which city it names. The river runs "
            "through the old town, past the cathedral and the market square, under "
            "seven stone bridges and along the quays where the boats are moored in "
            "summer; the town is Lyon, and its two rivers meet south of the centre.",
        }
    ]
    for _ in range(2):
        again = client.chat.completions.create(
            model=model, messages=long_messages, temperature=0, max_tokens=2
        )
    report["cached_tokens"] = again.usage.prompt_tokens_details.cached_tokens
    report["long_prompt_tokens"] = again.usage.prompt_tokens

    # A token id outside the vocabulary is the client's error, and the server goes on.
    try:
        client.completions.create(model=model, prompt=[1, 10**7], max_tokens=2)
        raise AssertionError("an out-of-vocabulary id was accepted")
    except openai.BadRequestError as e:
        report["bad_request"] = e.status_code
    after = client.completions.create(model=model, prompt=prompt_ids, max_tokens=2, temperature=0)
    assert after.choices[0].text

    print(json.dumps(report))


if __name__ == "__main__":
    main()
