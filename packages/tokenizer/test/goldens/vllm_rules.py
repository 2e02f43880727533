"""vLLM's chat rendering path, re-stated in Python for the goldens (no vLLM or transformers install here).

Each function names the vLLM source it re-states; the rules, not the code, come from there:
  - conversation():  vllm/entrypoints/chat_utils.py  _parse_chat_message_content(_part[s]), _postprocess_messages
  - content_format(): vllm/renderers/hf.py            _detect_content_format (the jinja2 AST walk)
  - tool_dump():     the request's pydantic ChatCompletionToolsParam.model_dump()
  - render():        transformers apply_chat_template: ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks),
                     tojson = json.dumps(ensure_ascii=False, ...), raise_exception, the special tokens that are set,
                     then continue_final_message's cut.
Request bodies are parsed with json.loads, so a float stays a float, as pydantic keeps it in vLLM.
"""
import json
from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEXT_FIELD = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}
MEDIA = {"image_url": "image", "input_image": "image", "image_pil": "image", "image_embeds": "image",
         "audio_url": "audio", "input_audio": "audio", "audio_embeds": "audio", "video_url": "video"}


def _part(part):
    if isinstance(part, str):
        return ("text", part)
    kind = part.get("type")
    if kind in TEXT_FIELD:
        text = part.get(TEXT_FIELD[kind])
        return None if text is None else ("text", text)
    if kind in MEDIA:
        return ("media", MEDIA[kind])
    raise ValueError(f"Unsupported chat content part type: {kind!r}")


def conversation(messages, fmt):
    out = []
    for m in messages:
        content = m.get("content")
        parts = [] if content is None else [content] if isinstance(content, str) else content
        parsed = [p for p in map(_part, parts) if p is not None]
        if fmt == "openai":
            msg_content = [{"type": "text", "text": v} if k == "text" else {"type": v} for k, v in parsed]
        else:
            msg_content = "\n".join(v for k, v in parsed if k == "text")
        msg = {"role": m["role"], "content": msg_content}
        if m["role"] == "assistant":
            if m.get("tool_calls") is not None:
                msg["tool_calls"] = [dict(c, function=dict(c["function"])) for c in m["tool_calls"]]
            # ChatCompletionRequest._normalize_messages_before: the deprecated reasoning_content is the reasoning.
            reasoning = m.get("reasoning") if m.get("reasoning") is not None else m.get("reasoning_content")
            if reasoning is not None:
                msg["reasoning"] = reasoning
                msg["reasoning_content"] = reasoning
        elif m["role"] == "tool":
            if "tool_call_id" in m:
                msg["tool_call_id"] = m["tool_call_id"]
            if isinstance(msg["content"], list) and all(p["type"] == "text" for p in msg["content"]):
                msg["content"] = "\n".join(p["text"] for p in msg["content"])
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    for msg in out:
        calls = msg.get("tool_calls")
        if msg["role"] != "assistant" or not isinstance(calls, list):
            continue
        if not calls:
            del msg["tool_calls"]
            continue
        for c in calls:
            args = c["function"].get("arguments")
            if isinstance(args, str):
                try:
                    c["function"]["arguments"] = json.loads(args)
                except json.JSONDecodeError:
                    c["function"]["arguments"] = {}
            elif not isinstance(args, (dict, list)):
                c["function"]["arguments"] = {}
    return out


def tool_dump(tool):
    fn = tool.get("function", {})
    return {"type": tool.get("type", "function"),
            "function": {"name": fn.get("name"), "description": fn.get("description"), "parameters": fn.get("parameters")}}


def _reads(node, name, key=None):
    if isinstance(node, (nodes.Filter, nodes.Test)):
        return node.node is not None and _reads(node.node, name, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _reads(node.node, name, key)
    if key is None:
        return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name
    if isinstance(node, nodes.Getitem):
        return _reads(node.node, name) and isinstance(node.arg, nodes.Const) and node.arg.value == key
    if isinstance(node, nodes.Getattr):
        return _reads(node.node, name) and node.attr == key
    return False


def content_format(env, source):
    ast = env.parse(source)
    lists = ["messages"]
    for name in lists:
        for a in ast.find_all(nodes.Assign):
            if isinstance(a.target, nodes.Name) and _reads(a.node, name) and a.target.name not in lists:
                lists.append(a.target.name)
    loops = list(ast.find_all(nodes.For))
    message_vars = [f.target.name for f in loops if any(_reads(f.iter, m) for m in lists)]
    return "openai" if any(_reads(f.iter, m, "content") for f in loops for m in message_vars) else "string"


def _raise(message):
    raise TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    return env


def special_tokens(config):
    def content(v):
        return v.get("content") if isinstance(v, dict) else v
    out = {k: content(config[k]) for k in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                                           "mask_token") if content(config.get(k)) is not None}
    if config.get("additional_special_tokens"):
        out["additional_special_tokens"] = [content(t) for t in config["additional_special_tokens"]]
    return out


def render(config, body):
    """The text vLLM's /v1/chat/completions tokenizes for this request body (a dict from json.loads)."""
    env = environment()
    source = config["chat_template"]
    chat = conversation(body["messages"], content_format(env, source))
    tools = None if body.get("tools") is None else [tool_dump(t) for t in body["tools"]]
    # ChatCompletionRequest.build_chat_params: the request's documents and reasoning_effort over its
    # chat_template_kwargs (merge_kwargs: a None leaves the kwarg alone), reasoning_effort implying enable_thinking.
    user = dict(body.get("chat_template_kwargs") or {})
    # OnlineRenderer.preprocess_chat puts the request's tools among the defaults, which the kwargs' own override
    # (unless None or "auto"); apply_chat_template takes them, and these other kwargs, as arguments, not variables.
    if user.get("tools") not in (None, "auto"):
        tools = user["tools"]
    for argument in ("tools", "chat_template", "tokenize", "continue_final_message"):
        user.pop(argument, None)
    extra = {"documents": body.get("documents"), "reasoning_effort": body.get("reasoning_effort")}
    if body.get("reasoning_effort") is not None and "enable_thinking" not in user:
        extra["enable_thinking"] = body["reasoning_effort"] != "none"
    kwargs = {"documents": None, **special_tokens(config), **user, **{k: v for k, v in extra.items() if v is not None}}
    text = env.from_string(source).render(messages=chat, tools=tools,
                                          add_generation_prompt=body.get("add_generation_prompt", True), **kwargs)
    if body.get("continue_final_message"):
        final = chat[-1]["content"]
        if isinstance(final, list):
            final = [p["text"] for p in final if "text" in p][-1]
        at = text.rindex(final.strip())
        keep = len(final.lstrip()) if text[at:at + len(final.lstrip())] == final else len(final.strip())
        text = text[:at + keep]
    return text
