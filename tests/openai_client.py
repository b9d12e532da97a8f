"""Drives a running routed gateway with the official `openai` Python client.

Usage: openai_client.py BASE_URL MODEL

Run by crates/server/tests/http_openai_python.rs, which starts the server. Exits 3 when the
`openai` or `numpy` package is missing (the Rust test then skips, unless CI=true).
"""

import base64
import datetime
import io
import json
import re
import sys
import uuid
from typing import Literal, Optional

try:
    import numpy as np
    import openai
    import pydantic
except ImportError as err:  # pragma: no cover - depends on the environment
    print(f"missing python package: {err}")
    sys.exit(3)


def decode_npy(b64):
    return np.load(io.BytesIO(base64.b64decode(b64)), allow_pickle=False)


def check_rows(rows, num_rows, routing):
    """Rows in the decoder-layer layout: MoE layers hold distinct ids, the others vLLM's zeros."""
    layers, top_k = routing["num_layers"], routing["top_k"]
    assert rows.shape == (num_rows, layers, top_k), (rows.shape, num_rows, layers, top_k)
    assert rows.dtype == np.uint8, rows.dtype
    moe = routing["moe_layer_ids"]
    assert (rows[:, moe] < routing["num_experts"]).all()
    for row in rows[:, moe].reshape(-1, top_k):
        assert len(set(row.tolist())) == top_k, row
    dense = [i for i in range(layers) if i not in moe]
    assert (rows[:, dense] == 0).all()


def main():
    base_url, model = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=60)

    # /v1/models carries the routing layout.
    entry = client.models.list().data[0].model_dump()
    assert entry["id"] == model, entry
    routing = entry["routing"]
    layers, top_k = routing["num_layers"], routing["top_k"]
    assert len(routing["moe_layer_ids"]) == routing["num_moe_layers"]

    # Completions: routing requested through extra_body, decoded with numpy.
    prompt = [10 + (i * 37) % 400 for i in range(20)]
    extra = {"ignore_eos": True, "return_token_ids": True, "return_routed_experts": True}
    whole = client.completions.create(
        model=model, prompt=prompt, max_tokens=8, temperature=0, extra_body=extra
    ).model_dump()
    choice = whole["choices"][0]
    generated = choice["token_ids"]
    assert choice["prompt_token_ids"] == prompt
    assert whole["usage"]["prompt_tokens"] == 20 and whole["usage"]["completion_tokens"] == 8
    rows = decode_npy(choice["routed_experts"])
    check_rows(rows, 20 + len(generated) - 1, routing)
    meta = whole["routed_experts_meta"]
    assert meta["moe_layer_ids"] == routing["moe_layer_ids"] and meta["dtype"] == "uint8", meta
    saved = io.BytesIO()
    np.save(saved, rows)
    assert saved.getvalue() == base64.b64decode(choice["routed_experts"]), "np.save disagrees"

    # raw int32 and a start offset decode to the same values.
    raw = client.completions.create(
        model=model, prompt=prompt, max_tokens=8, temperature=0,
        extra_body={**extra, "routed_experts_format": "raw_b64_int32", "routed_experts_start_len": 5},
    ).model_dump()["choices"][0]
    flat = np.frombuffer(base64.b64decode(raw["routed_experts"]), dtype="<i4")
    assert (flat.reshape(-1, layers, top_k) == rows[5:]).all()

    # Streaming: text deltas add up, and the final chunk carries the same routing.
    text, streamed_rows, usage = "", None, None
    stream = client.completions.create(
        model=model, prompt=prompt, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=extra,
    )
    for chunk in stream:
        chunk = chunk.model_dump()
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk["choices"]:
            text += c["text"]
            if c.get("routed_experts") is not None:
                assert c["finish_reason"] == "length", c
                streamed_rows = decode_npy(c["routed_experts"])
    assert text == choice["text"], (text, choice["text"])
    assert streamed_rows is not None and (streamed_rows == rows).all()
    assert usage["completion_tokens"] == 8, usage

    # Chat, whole and streamed.
    messages = [{"role": "user", "content": "Which experts did you use?"}]
    chat = client.chat.completions.create(
        model=model, messages=messages, max_tokens=6, temperature=0, extra_body=extra
    ).model_dump()
    c = chat["choices"][0]
    assert c["message"]["role"] == "assistant"
    prompt_len = len(chat["prompt_token_ids"])
    check_rows(decode_npy(c["routed_experts"]), prompt_len + len(c["token_ids"]) - 1, routing)
    deltas, final = "", None
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=6, temperature=0, stream=True, extra_body=extra
    ):
        chunk = chunk.model_dump()
        for d in chunk["choices"]:
            deltas += d["delta"].get("content") or ""
            if d.get("routed_experts") is not None:
                final = d["routed_experts"]
    assert deltas == c["message"]["content"]
    assert final == c["routed_experts"]

    # Tools as the client sends them, with tool_choice "none" (this server reads no calls) and a
    # template variable through extra_body: the answer is the plain chat's.
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }}]
    with_tools = client.chat.completions.create(
        model=model, messages=messages, max_tokens=6, temperature=0, tools=tools,
        tool_choice="none", extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    ).choices[0].message
    assert with_tools.content == c["message"]["content"], with_tools
    assert not with_tools.tool_calls, with_tools

    # A forced tool choice (no parser needed): the answer is the calls, as the client reads them.
    num_called = 0
    for seed in range(6):
        for choice in [{"type": "function", "function": {"name": "get_weather"}}, "required"]:
            forced = client.chat.completions.create(
                model=model, messages=messages, max_tokens=160, temperature=1.0, seed=seed,
                tools=tools, tool_choice=choice,
            ).choices[0]
            if forced.finish_reason == "length":
                continue
            assert forced.finish_reason == ("stop" if isinstance(choice, dict) else "tool_calls")
            for call in forced.message.tool_calls:
                assert call.function.name == "get_weather", forced
                assert isinstance(json.loads(call.function.arguments), dict), forced
            num_called += 1
    assert num_called > 0, "no forced answer ended"

    # Streamed, the client's accumulated deltas hold the same named call.
    named = {"type": "function", "function": {"name": "get_weather"}}
    ask = dict(model=model, messages=messages, max_tokens=40, temperature=1.0, seed=1,
               tools=tools, tool_choice=named)
    whole = client.chat.completions.create(**ask).choices[0].message.tool_calls[0].function
    pieces = [
        d.function
        for chunk in client.chat.completions.create(stream=True, **ask)
        for d in (chunk.choices[0].delta.tool_calls or [])
    ]
    assert pieces[0].name == "get_weather", pieces
    assert "".join(p.arguments or "" for p in pieces) == whole.arguments, (pieces, whole)

    # JSON mode as the client asks for it: a whole object when EOS ended the answer, else the
    # start of one.
    for seed in range(4):
        answer = client.chat.completions.create(
            model=model, messages=messages, max_tokens=40, temperature=1.0, seed=seed,
            response_format={"type": "json_object"},
        ).choices[0]
        content = answer.message.content or ""
        if answer.finish_reason == "stop":
            assert isinstance(json.loads(content), dict), content
        else:
            assert not content.strip() or content.strip().startswith("{"), content

    # Structured outputs as the client parses them: a pydantic model turned into a strict JSON
    # schema (an enum, a nullable integer), the answer read back into the model. An answer cut
    # at max_tokens is the client's LengthFinishReasonError.
    class Verdict(pydantic.BaseModel):
        ok: bool
        label: Literal["yes", "no"]
        score: Optional[int]

    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse

    def parsed(model_class, max_tokens=96):
        """The answers of eight seeds read back into `model_class`, those cut short left out."""
        answers = []
        for seed in range(8):
            try:
                answers.append(parse(
                    model=model, messages=messages, max_tokens=max_tokens, temperature=1.0,
                    seed=seed,
                    response_format=model_class,
                ).choices[0].message.parsed)
            except openai.LengthFinishReasonError:
                continue
        assert answers, f"no {model_class.__name__} answer closed its object"
        return answers

    assert all(isinstance(v, Verdict) for v in parsed(Verdict))

    def stopped_answers(key, sglang_key, constraint, prompt):
        """The answers EOS ended, over six seeds, with `constraint` sent as vLLM's clients send
        it (extra_body): in `structured_outputs` under `key`, and as the older `guided_{key}`;
        and as SGLang's send it, top-level under `sglang_key`."""
        stopped = []
        extras = [
            {"structured_outputs": {key: constraint}},
            {f"guided_{key}": constraint},
            {sglang_key: constraint},
        ]
        for seed in range(6):
            for extra in extras:
                answer = client.completions.create(
                    model=model, prompt=prompt, max_tokens=24, temperature=1.0, seed=seed,
                    extra_body=extra,
                ).choices[0]
                if answer.finish_reason == "stop":
                    stopped.append(answer.text)
        return stopped

    # A regex, and a pydantic field's pattern: Python's own `re` checks every answer EOS ended.
    pattern = r"(yes|no), [0-9]{1,3} (apples|pears)\."
    matched = stopped_answers("regex", "regex", pattern, "Apples?")
    assert matched, "no answer ended on a match"
    for text in matched:
        assert re.fullmatch(pattern, text), text

    # A grammar (GBNF): arithmetic that nests, so Python's own parser checks every answer EOS
    # ended.
    grammar = (
        'root ::= expr\n'
        'expr ::= term (("+" | "-") term)*\n'
        'term ::= factor ("*" factor)*\n'
        'factor ::= [1-9] | "(" expr ")"\n'
    )
    parsed_sums = stopped_answers("grammar", "ebnf", grammar, "1+1=")
    assert parsed_sums, "no answer ended on a whole expression"
    for text in parsed_sums:
        assert re.fullmatch(r"[1-9+\-*()]+", text), text
        compile(text, "<answer>", "eval")

    class Order(pydantic.BaseModel):
        answer: str = pydantic.Field(pattern=r"^(yes|no), [0-9]{1,3} (apples|pears)\.$")

    for order in parsed(Order):
        assert re.fullmatch(pattern, order.answer), order

    # Bounded numbers as pydantic writes them (ge/le, gt/lt), and a tuple (prefixItems): pydantic
    # itself checks the answers when it reads them back, and so does this.
    class Rating(pydantic.BaseModel):
        score: float = pydantic.Field(ge=0, le=10)
        weight: float = pydantic.Field(gt=-0.5, lt=0.25)
        span: tuple[int, bool]

    for rating in parsed(Rating):
        assert 0 <= rating.score <= 10 and -0.5 < rating.weight < 0.25, rating
        assert isinstance(rating.span[0], int) and isinstance(rating.span[1], bool), rating

    # String formats a validator parses (pydantic's date, time, datetime, timedelta and UUID):
    # every answer read back is one, which pydantic checks.
    class Event(pydantic.BaseModel):
        day: datetime.date
        at: datetime.datetime
        starts: datetime.time
        lasts: datetime.timedelta
        id: uuid.UUID

    for event in parsed(Event, max_tokens=320):
        assert event.at.tzinfo is not None and event.starts.tzinfo is not None, event

    # The sampling fields the client sends natively: a logit bias forces a token, penalties are
    # accepted, and the same seed gives the same draw.
    forced = client.completions.create(
        model=model, prompt=prompt, max_tokens=4, temperature=0, logit_bias={"77": 100},
        presence_penalty=0.5, frequency_penalty=0.5, extra_body={"return_token_ids": True},
    ).model_dump()["choices"][0]
    assert forced["token_ids"] == [77] * 4, forced
    draws = [
        client.completions.create(
            model=model, prompt=prompt, max_tokens=6, temperature=1.0, seed=3,
            extra_body={"min_p": 0.1, "repetition_penalty": 1.3, "return_token_ids": True},
        ).model_dump()["choices"][0]["token_ids"]
        for _ in range(2)
    ]
    assert draws[0] == draws[1], draws

    # Token-in/token-out agents read the sampled ids back from chat logprobs named
    # `token_id:<id>`, and keep the stop string they stopped on.
    ided = client.chat.completions.create(
        model=model, messages=messages, max_tokens=5, temperature=0, logprobs=True,
        extra_body={"return_tokens_as_token_ids": True, "return_token_ids": True},
    ).model_dump()["choices"][0]
    parsed = [int(entry["token"].split(":")[-1]) for entry in ided["logprobs"]["content"]]
    assert parsed == ided["token_ids"], (parsed, ided["token_ids"])
    text = c["message"]["content"]
    stop = text[2:4]
    kept = client.chat.completions.create(
        model=model, messages=messages, max_tokens=6, temperature=0, stop=[stop],
        extra_body={"include_stop_str_in_output": True},
    ).model_dump()["choices"][0]["message"]["content"]
    assert kept == text[: text.index(stop) + len(stop)], (kept, text, stop)

    # vLLM's and SGLang's fields that shape the prompt and the text, through extra_body: the
    # prompt cut to its last tokens answers as those tokens do; a stop pattern cuts the text
    # where its match starts; a bad word is never written.
    ids = list(range(10, 40))
    cut = client.completions.create(
        model=model, prompt=ids, max_tokens=4, temperature=0,
        extra_body={"truncate_prompt_tokens": 6, "return_token_ids": True},
    ).model_dump()["choices"][0]
    tail = client.completions.create(
        model=model, prompt=ids[-6:], max_tokens=4, temperature=0,
        extra_body={"return_token_ids": True},
    ).model_dump()["choices"][0]
    assert cut["prompt_token_ids"] == ids[-6:] and cut["token_ids"] == tail["token_ids"], cut
    plain = client.completions.create(
        model=model, prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True},
    ).choices[0].text
    word = re.escape(plain[4:6])
    stopped = client.completions.create(
        model=model, prompt=prompt, max_tokens=12, temperature=0,
        extra_body={"ignore_eos": True, "stop_regex": [f"(?:{word})+"]},
    ).choices[0]
    assert stopped.text == plain[: re.search(word, plain).start()], (stopped.text, plain)
    assert stopped.finish_reason == "stop", stopped
    # Token 77, forced above, is the word its text encodes to.
    word = forced["text"][: len(forced["text"]) // 4]
    banned = client.completions.create(
        model=model, prompt=prompt, max_tokens=4, temperature=0, logit_bias={"77": 100},
        extra_body={"bad_words": [word], "return_token_ids": True},
    ).model_dump()["choices"][0]
    assert 77 not in banned["token_ids"], (word, banned)

    # A structural tag as SGLang's docs pass it through the client's response_format: a bias
    # on `<` (token 30) makes the checkpoint write the trigger, and every one opens a call.
    tagged = client.chat.completions.create(
        model=model, messages=messages, max_tokens=30, temperature=0, logit_bias={"30": 8},
        response_format={
            "type": "structural_tag",
            "structures": [{"begin": "<call>", "schema": {"type": "boolean"}, "end": "</call>"}],
            "triggers": ["<"],
        },
    ).choices[0]
    calls = re.findall(r"<call>\s*(true|false)\s*</call>", tagged.message.content)
    rest = re.sub(r"<call>\s*(true|false)\s*</call>", "", tagged.message.content)
    assert calls and ("<" not in rest or tagged.finish_reason == "length"), tagged

    # Scoring a prompt as lm-eval's loglikelihood tasks do: echo with logprobs, the first token
    # without a logprob; and vLLM's prompt_logprobs beside it.
    text = "The experts route every token"
    scored = client.completions.create(
        model=model, prompt=text, max_tokens=1, temperature=0, logprobs=1, echo=True,
        extra_body={"prompt_logprobs": 1},
    ).choices[0]
    assert scored.text.startswith(text), scored.text
    values = scored.logprobs.token_logprobs
    assert values[0] is None and all(v <= 0 for v in values[1:]), values
    assert scored.logprobs.top_logprobs[0] is None
    prompt_logprobs = scored.model_dump()["prompt_logprobs"]
    assert prompt_logprobs[0] is None and len(prompt_logprobs) == len(values) - 1
    for position, entry in enumerate(prompt_logprobs[1:], start=1):
        best = min(entry.values(), key=lambda e: e["rank"])
        assert best["rank"] == 1 and set(best) == {"logprob", "rank", "decoded_token"}, entry
        assert values[position] in [e["logprob"] for e in entry.values()], (position, entry)

    # Errors surface as the client's typed exceptions.
    try:
        client.completions.create(model="no-such-model", prompt="x")
        raise AssertionError("unknown model accepted")
    except openai.NotFoundError as err:
        assert err.status_code == 404
    try:
        client.completions.create(model=model, prompt="x", extra_body={"routed_experts_start_len": 99})
        raise AssertionError("bad start accepted")
    except openai.BadRequestError as err:
        assert err.param == "routed_experts_start_len", err.body
    try:
        client.completions.create(model=model, prompt="x", presence_penalty=3.0)
        raise AssertionError("presence_penalty 3 accepted")
    except openai.BadRequestError as err:
        assert err.param == "presence_penalty", err.body
    print("openai client agrees")


if __name__ == "__main__":
    main()
