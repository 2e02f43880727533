// Where SGLang's OpenAI server renders a chat otherwise than vLLM's, each rendered here by both engines' rules. The
// SGLang texts are what its code gives (commit 3ba38dc0: python/sglang/srt/entrypoints/chat_input/,
// python/sglang/srt/parser/jinja_template_utils.py; each test names the function), written out by hand for
// templates small enough to read; the vLLM texts are what the vLLM rules gave before SGLang's existed.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { BadRequest, ChatTemplateError, ChatUnrenderable, createPreprocessor, ignoredRenderingFlags, readBody, type Preprocessor, type TokenizeJob } from "../src/index";
import { parseBodyBytes } from "../src/request/openai-body";
import { ROUTING_TEXT_CHARS, routingJob } from "../src/request/routing-job";
import { encodeJob, renderOptions } from "../src/job";
import { chatOf, render, TemplateServers } from "./template-servers";

let servers: TemplateServers;
beforeAll(async () => {
  servers = await TemplateServers.open("sglang-rules-");
});
afterAll(() => servers.close());

/** The same template served by an SGLang worker and by a vLLM one. */
const both = (template: string, defaultChatTemplateKwargs?: string): { sglang: Preprocessor; vllm: Preprocessor } => ({
  sglang: servers.server(template, { chatRendering: "sglang", defaultChatTemplateKwargs }),
  vllm: servers.server(template, { defaultChatTemplateKwargs }),
});

const CONTENTS = "{% for m in messages %}[{{ m.content }}]{% endfor %}";
const user = (content: unknown) => ({ messages: [{ role: "user", content }] });
const fn = { type: "function", function: { name: "f", parameters: { type: "object" } } };

describe("tools", () => {
  test("the template gets each tool as Tool.model_dump gives it: description first, strict false where unset, the tool's defer_loading null", () => {
    const { sglang, vllm } = both("{{ tools | tojson }}");
    // ChatInputProcessor._prepare_tools: tools = [item.model_dump() for item in request.tools] (schema.py Tool, Function).
    expect(render(sglang, { ...user("q"), tools: [fn] })).toBe(
      '[{"type": "function", "function": {"description": null, "name": "f", "parameters": {"type": "object"}, "strict": false}, "defer_loading": null}]',
    );
    expect(render(sglang, { ...user("q"), tools: [{ ...fn, function: { ...fn.function, strict: true, description: "d" } }] })).toBe(
      '[{"type": "function", "function": {"description": "d", "name": "f", "parameters": {"type": "object"}, "strict": true}, "defer_loading": null}]',
    );
    // Tool._propagate_defer_loading: the tool's reaches its function.
    expect(render(sglang, { ...user("q"), tools: [{ ...fn, defer_loading: true }] })).toBe(
      '[{"type": "function", "function": {"description": null, "name": "f", "parameters": {"type": "object"}, "strict": false, "defer_loading": true}, "defer_loading": true}]',
    );
    expect(render(vllm, { ...user("q"), tools: [fn] })).toBe('[{"type": "function", "function": {"name": "f", "description": null, "parameters": {"type": "object"}}}]');
  });

  test("tool_choice \"none\" renders without tools, a named one with that tool alone, and an empty list as none", () => {
    const { sglang, vllm } = both("{% if tools %}{% for t in tools %}{{ t.function.name }},{% endfor %}{% endif %}|{{ tools }}");
    const g = { type: "function", function: { name: "g" } };
    const chat = { ...user("q"), tools: [fn, g] };
    // _prepare_tools: tools only when request.tool_choice != "none"; a ToolChoice keeps the tools of its name.
    expect(render(sglang, { ...chat, tool_choice: "none" })).toBe("|None");
    expect(render(sglang, { ...chat, tool_choice: { type: "function", function: { name: "g" } } })).toBe("g,|" + "[{'type': 'function', 'function': {'description': None, 'name': 'g', 'parameters': None, 'strict': False}, 'defer_loading': None}]");
    // `if effective_tools`: an empty list is no tools.
    expect(render(sglang, { ...user("q"), tools: [] })).toBe("|None");
    expect(render(vllm, { ...chat, tool_choice: "none" })).toBe("f,g,|" + "[{'type': 'function', 'function': {'name': 'f', 'description': None, 'parameters': {'type': 'object'}}}, {'type': 'function', 'function': {'name': 'g', 'description': None, 'parameters': None}}]");
    expect(render(vllm, { ...user("q"), tools: [] })).toBe("|[]");
  });

  test("a template that raises with the tools as given is rendered again with each tool flattened to its function", () => {
    const { sglang, vllm } = both('{% if tools[0].function is defined %}{{ raise_exception("flat tools only") }}{% endif %}{{ tools[0].name }}:{{ tools[0].strict }}');
    // _apply_jinja_template: on a failed apply_chat_template, tools = [t["function"] if "function" in t else t].
    expect(render(sglang, { ...user("q"), tools: [fn] })).toBe("f:False");
    expect(() => render(vllm, { ...user("q"), tools: [fn] })).toThrow(ChatTemplateError);
    // A failure again is the request's (a 400), as SGLang's retry raises it.
    const raises = both('{{ raise_exception("never") }}').sglang;
    expect(() => render(raises, { ...user("q"), tools: [fn] })).toThrow(ChatTemplateError);
  });

  test("a template written for flat tools, which jinja2 fails on with wrapped ones (tojson or an attribute of undefined), is rendered with flat tools", () => {
    // SGLang retries on any exception: json.dumps' TypeError on an Undefined, jinja2's UndefinedError.
    const { sglang, vllm } = both("{% for t in tools %}{{ t.name | tojson }}{% endfor %}");
    expect(render(sglang, { ...user("q"), tools: [fn] })).toBe('"f"');
    // vLLM answers a template's TypeError with a 400 (its jinja2 errors are client errors): so does the EPP.
    expect(() => render(vllm, { ...user("q"), tools: [fn] })).toThrow(ChatTemplateError);
    const attribute = both("{% for t in tools %}{{ t.parameters.type }}{% endfor %}").sglang;
    expect(render(attribute, { ...user("q"), tools: [fn] })).toBe("object");
  });
});

describe("content parts", () => {
  test("the string format joins text parts with a space, an empty one included", () => {
    const { sglang, vllm } = both(CONTENTS);
    const parts = [{ type: "text", text: "a" }, { type: "text", text: "" }, { type: "image_url", image_url: { url: "u" } }, { type: "text", text: "b" }];
    // process_content_for_template_format, "string": " ".join(text_parts).
    expect(render(sglang, user(parts))).toBe("[a  b]");
    expect(render(vllm, user(parts))).toBe("[a\nb]");
  });

  test("a tool message's text parts are joined with a space in either format", () => {
    const tool = { messages: [{ role: "user", content: "q" }, { role: "tool", tool_call_id: "c", content: [{ type: "text", text: "a" }, { type: "text", text: "b" }] }] };
    const loops = "{% for m in messages %}{% if m.content is string %}[{{ m.content }}]{% else %}{% for p in m.content %}<{{ p.text }}>{% endfor %}{% endif %}{% endfor %}";
    // normalize_tool_content: " ".join(text_parts). A string content stays a string in the "openai" format, where
    // vLLM wraps it as one text part.
    for (const [template, vllmText] of [[CONTENTS, "[q][a\nb]"], [loops, "<q>[a\nb]"]] as const) {
      const { sglang, vllm } = both(template);
      expect(render(sglang, tool)).toBe("[q][a b]");
      expect(render(vllm, tool)).toBe(vllmText);
    }
  });

  test("the format is detected once on the template's text: a media word makes it \"openai\", and so does a loop over message/msg/m.content alone", () => {
    const parts = user([{ type: "text", text: "a" }, { type: "text", text: "b" }]);
    // detect_jinja_template_content_format: any of image/audio/video/vision in the text is "openai".
    const mentions = both(`{# vision #}${CONTENTS}`);
    expect(render(mentions.sglang, parts)).toBe("[[{'type': 'text', 'text': 'a'}, {'type': 'text', 'text': 'b'}]]");
    expect(render(mentions.vllm, parts)).toBe("[a\nb]");
    // A loop over `msg.content` counts by the name, whatever `msg` holds; vLLM's counts a message of `messages` only.
    const named = both("{% set msg = messages[0] %}{% if msg.content is string %}S:{{ msg.content }}{% else %}{% for p in msg.content %}<{{ p.text }}>{% endfor %}{% endif %}");
    expect(render(named.sglang, parts)).toBe("<a><b>");
    expect(render(named.vllm, parts)).toBe("S:a\nb");
    // And a loop over another name's content does not count for SGLang.
    const turn = both("{% for turn in messages %}{% if turn.content is string %}{{ turn.content }}{% else %}{% for p in turn.content %}<{{ p.text }}>{% endfor %}{% endif %}{% endfor %}");
    expect(render(turn.sglang, parts)).toBe("a b");
    expect(render(turn.vllm, parts)).toBe("<a><b>");
  });

  test("in the \"openai\" format, a string content stays a string and null content is an empty one", () => {
    const { sglang, vllm } = both("{% for m in messages %}{% if m.content is string %}S{% else %}L{% for p in m.content %}{% endfor %}{{ m.content | length }}{% endif %};{% endfor %}");
    const chat = { messages: [{ role: "user", content: "q" }, { role: "assistant", content: null, tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: "{}" } }] }, { role: "user", content: "r" }] };
    // _apply_jinja_template: content None becomes "" before process_content_for_template_format, which leaves
    // anything but a list as it is.
    expect(render(sglang, chat)).toBe("S;S;S;");
    expect(render(vllm, chat)).toBe("L1;L0;L1;");
  });
});

describe("the final assistant message", () => {
  const TURNS = "{% for m in messages %}<{{ m.role }}:{{ m.content }}>{% endfor %}{% if add_generation_prompt %}<assistant:{% endif %}";
  const chat = { messages: [{ role: "user", content: "q" }, { role: "assistant", content: "Sure" }] };

  test("without continue_final_message it renders as a user turn, with the generation prompt after it", () => {
    const { sglang, vllm } = both(TURNS);
    // _handle_last_assistant_message: messages[-1] = {"role": "user", "content": last_content}.
    expect(render(sglang, chat)).toBe("<user:q><user:Sure><assistant:");
    expect(render(vllm, chat)).toBe("<user:q><assistant:Sure><assistant:");
  });

  test("with continue_final_message it is left out, and its text is tokenized on its own after the generation prompt", () => {
    const { sglang, vllm } = both(TURNS);
    // _handle_last_assistant_message pops it; apply_chat_template(add_generation_prompt=True); then
    // _append_assistant_prefix_to_prompt_ids appends tokenizer.encode(prefix) (less a leading bos).
    const continued = { ...chat, continue_final_message: true };
    expect(render(sglang, continued)).toBe("<user:q><assistant:Sure");
    const { messages, opts } = chatOf(sglang, continued);
    const plain = createPreprocessor({ tokenizerDir: servers.source, cache: false });
    const ids = (text: string) => Array.from(plain.encodeCompletion(text, { addSpecialTokens: false }));
    expect(Array.from(sglang.encodeChat(messages, opts))).toEqual([...ids("<user:q><assistant:"), ...ids("Sure")]);
    // vLLM refuses continue_final_message with the generation prompt (its default), and cuts its rendering otherwise.
    expect(() => render(vllm, continued)).toThrow(BadRequest);
    const cut = { ...continued, add_generation_prompt: false };
    expect(render(vllm, cut)).toBe("<user:q><assistant:Sure");
    expect(Array.from(vllm.encodeChat(chatOf(vllm, cut).messages, chatOf(vllm, cut).opts))).toEqual(ids("<user:q><assistant:Sure"));
  });

  test("a chat cut at the routing bound renders its last message as the request's prompt does there: it is not the final one", () => {
    const { sglang } = both(TURNS);
    const long = "w ".repeat(ROUTING_TEXT_CHARS);
    const routed = (body: Record<string, unknown>) => {
      const job = routingJob(parseBodyBytes(new TextEncoder().encode(JSON.stringify(body)), "/v1/chat/completions", sglang.rules).input);
      if (!("kind" in job) || job.kind !== "chat") throw new Error("not a chat job");
      expect(job.cut).toBe("before-final");
      const cut = job.messages.at(-1)!.content as string;
      // The job's encode renders it so too (not by the request's options alone).
      expect(Array.from(encodeJob(sglang, job))).toEqual(Array.from(sglang.encodeChat(job.messages, renderOptions(job))));
      return { text: sglang.renderChat(job.messages, renderOptions(job)), cut };
    };
    const messages = [{ role: "user", content: "q" }, { role: "assistant", content: long }, { role: "user", content: "r" }];
    const plain = routed({ messages });
    expect(plain.text).toBe(`<user:q><assistant:${plain.cut}><assistant:`);
    // With continue_final_message the request's final message is continued, not the one the cut ends on.
    const continued = routed({ messages: [...messages, { role: "assistant", content: "Sure" }], continue_final_message: true });
    expect(continued.text).toBe(`<user:q><assistant:${continued.cut}><assistant:`);
  });

  test("a chat cut inside its final assistant message keeps the final-turn rule for what is left of it", () => {
    const { sglang } = both(TURNS);
    const routed = (body: Record<string, unknown>) => {
      const job = routingJob(parseBodyBytes(new TextEncoder().encode(JSON.stringify(body)), "/v1/chat/completions", sglang.rules).input);
      if (!("kind" in job) || job.kind !== "chat") throw new Error("not a chat job");
      expect(job.messages.length).toBe(2);
      expect(job.cut).toBe("in-final");
      const cut = job.messages.at(-1)!.content as string;
      expect(cut.length).toBeLessThan(ROUTING_TEXT_CHARS);
      expect(Array.from(encodeJob(sglang, job))).toEqual(Array.from(sglang.encodeChat(job.messages, job.opts)));
      return { text: sglang.renderChat(job.messages, job.opts), cut };
    };
    const messages = [{ role: "user", content: "q" }, { role: "assistant", content: "w ".repeat(ROUTING_TEXT_CHARS) }];
    // As the whole request renders it: a user turn, then the generation prompt.
    const plain = routed({ messages });
    expect(plain.text).toBe(`<user:q><user:${plain.cut}><assistant:`);
    // With continue_final_message, left out of the template and continued after the generation prompt.
    const continued = routed({ messages, continue_final_message: true });
    expect(continued.text).toBe(`<user:q><assistant:${continued.cut}`);
  });

  test("add_generation_prompt is not SGLang's to turn off: the generation prompt is always rendered", () => {
    const { sglang, vllm } = both(TURNS);
    const ask = { messages: [{ role: "user", content: "q" }], add_generation_prompt: false };
    expect(render(sglang, ask)).toBe("<user:q><assistant:");
    expect(render(vllm, ask)).toBe("<user:q>");
  });
});

describe("template variables", () => {
  const EFFORT = "{{ reasoning_effort }}|{{ enable_thinking }}|{{ thinking }}";

  test("a reasoning effort sets thinking and enable_thinking alike, where the kwargs do not name them", () => {
    const { sglang, vllm } = both(EFFORT);
    // normalize_reasoning_inputs: ctk.setdefault("thinking" / "enable_thinking", effort != "none").
    expect(render(sglang, { ...user("q"), reasoning_effort: "low" })).toBe("low|True|True");
    expect(render(sglang, { ...user("q"), reasoning_effort: "none" })).toBe("none|False|False");
    expect(render(sglang, { ...user("q"), reasoning_effort: "none", chat_template_kwargs: { enable_thinking: true } })).toBe("none|True|False");
    // `reasoning: {effort}` is read too, and `reasoning.enabled` turns thinking on.
    expect(render(sglang, { ...user("q"), reasoning: { effort: "high" } })).toBe("high|True|True");
    expect(render(sglang, { ...user("q"), reasoning: { enabled: "yes" } })).toBe("|True|True");
    // The serving path: a reasoning_effort in the kwargs is the request's (and sets nothing else).
    expect(render(sglang, { ...user("q"), chat_template_kwargs: { reasoning_effort: "max" } })).toBe("max||");
    expect(render(vllm, { ...user("q"), reasoning_effort: "low" })).toBe("low|True|");
    expect(render(vllm, { ...user("q"), reasoning_effort: "none" })).toBe("none|False|");
    expect(render(vllm, { ...user("q"), reasoning: { effort: "high" } })).toBe("||");
  });

  test("reasoning.effort replaces reasoning_effort before either is validated, and a reasoning input makes bad kwargs {}", () => {
    const { sglang } = both(EFFORT);
    // normalize_reasoning_inputs is a before-validator: what it replaced is never validated.
    expect(render(sglang, { ...user("q"), reasoning_effort: "bogus", reasoning: { effort: "high" } })).toBe("high|True|True");
    // It sets chat_template_kwargs to {} (then the defaults) when they are no dict and thinking is set.
    expect(render(sglang, { ...user("q"), reasoning_effort: "low", chat_template_kwargs: "x" })).toBe("low|True|True");
    expect(render(sglang, { ...user("q"), reasoning: { enabled: true }, chat_template_kwargs: [1] })).toBe("|True|True");
    expect(() => render(sglang, { ...user("q"), reasoning_effort: "bogus" })).toThrow(BadRequest);
    expect(() => render(sglang, { ...user("q"), chat_template_kwargs: "x" })).toThrow(BadRequest);
  });

  test("a numeric reasoning effort is a float in [0, 0.99] (SGLang's extension), a numeric string too; outside it, refused", () => {
    const { sglang } = both(EFFORT);
    expect(render(sglang, { ...user("q"), reasoning_effort: 0 })).toBe("0.0|True|True");
    expect(render(sglang, { ...user("q"), reasoning_effort: " 0.99 " })).toBe("0.99|True|True");
    expect(render(sglang, { ...user("q"), reasoning: { effort: "0.5" } })).toBe("0.5|True|True");
    for (const effort of [1, -0.1, "1.5", 5, "0x0", "0b0"])
      expect(() => render(sglang, { ...user("q"), reasoning_effort: effort })).toThrow(BadRequest);
    expect(() => render(sglang, { ...user("q"), reasoning: { effort: 2 } })).toThrow(BadRequest);
  });

  test("the server's default kwargs fill only what the request's kwargs leave out: a request's null stays null", () => {
    const { sglang, vllm } = both("{{ enable_thinking }}", '{"enable_thinking": false}');
    // ChatInputProcessor._resolve_input: ctk.setdefault(k, v) for the server's default_chat_template_kwargs.
    expect(render(sglang, { ...user("q"), chat_template_kwargs: { enable_thinking: null } })).toBe("None");
    expect(render(sglang, user("q"))).toBe("False");
    expect(render(vllm, { ...user("q"), chat_template_kwargs: { enable_thinking: null } })).toBe("False");
  });

  test("documents and a request's chat_template are no fields of SGLang's request; a kwargs chat_template is not mirrored", () => {
    const { sglang, vllm } = both("{{ documents }}");
    const docs = { ...user("q"), documents: [{ title: "t", text: "d" }] };
    expect(render(sglang, docs)).toBe("None");
    expect(render(vllm, docs)).toBe("[{'title': 't', 'text': 'd'}]");
    expect(render(sglang, { ...user("q"), chat_template: "{{ 1 }}" })).toBe("None");
    expect(() => render(sglang, { ...user("q"), chat_template_kwargs: { chat_template: "{{ 1 }}" } })).toThrow(ChatUnrenderable);
  });
});

describe("messages", () => {
  test("a message keeps only its model's fields: reasoning_content (not vLLM's reasoning), and no name on a user turn", () => {
    const { sglang, vllm } = both("{% for m in messages %}{{ m.role }}:{{ m.name }}:{{ m.reasoning_content }}/{{ m.reasoning }};{% endfor %}");
    const chat = {
      messages: [
        { role: "user", content: "q", name: "bob" },
        { role: "assistant", content: "a", reasoning_content: "r1" },
        { role: "assistant", content: "b", reasoning: "r2" },
        { role: "user", content: "c" },
      ],
    };
    // ChatCompletionMessageUserParam has role and content; the generic one reasoning_content, and no `reasoning`.
    expect(render(sglang, chat)).toBe("user::/;assistant::r1/;assistant::/;user::/;");
    expect(render(vllm, chat)).toBe("user:bob:/;assistant::r1/r1;assistant::r2/r2;user::/;");
  });

  test("a system message keeps a Claude Code billing header line, which vLLM strips", () => {
    const { sglang, vllm } = both(CONTENTS);
    const chat = { messages: [{ role: "system", content: "x-anthropic-billing-header: cch=1\nBe brief." }, { role: "user", content: "q" }] };
    // Nothing in SGLang's chat path strips it (vLLM's _strip_claude_code_billing_header has no counterpart).
    expect(render(sglang, chat)).toBe("[x-anthropic-billing-header: cch=1\nBe brief.][q]");
    expect(render(vllm, chat)).toBe("[Be brief.][q]");
  });

  test("an assistant's tool-call arguments must be a JSON object, where vLLM makes anything else {}", () => {
    const { sglang, vllm } = both("{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}");
    const call = (args: string) => ({ messages: [{ role: "user", content: "q" }, { role: "assistant", tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: args } }] }, { role: "user", content: "r" }] });
    expect(render(sglang, call('{"x": 1.0}'))).toBe('{"x": 1.0}');
    // normalize_assistant_tool_call_arguments: parse_tool_call_arguments raises ValueError (a 400).
    expect(() => render(sglang, call("not json"))).toThrow(ChatTemplateError);
    expect(() => render(sglang, call("[1]"))).toThrow(ChatTemplateError);
    expect(render(vllm, call("not json"))).toBe("{}");
  });
});

test("--chat-template is a .jinja file, read as SGLang reads it: outer newlines stripped, a literal \\n a newline", () => {
  const file = join(servers.root, "served.jinja");
  writeFileSync(file, "\n\n{% for m in messages %}[{{ m.content }}]\\n{% endfor %}\n");
  // TemplateManager._load_jinja_template: "".join(f.readlines()).strip("\n"), then .replace("\\n", "\n").
  expect(render(servers.server(CONTENTS, { chatRendering: "sglang", chatTemplate: file }), user("q"))).toBe("[q]\n");
  expect(render(servers.server(CONTENTS, { chatTemplate: file }), user("q"))).toBe("\n\n[q]\\n");
});

test("--chat-template's file is read in text mode by both engines: CRLF and a lone CR are newlines", () => {
  const file = join(servers.root, "crlf.jinja");
  writeFileSync(file, "\r\n{% for m in messages %}[{{ m.content }}]\r\n{% endfor %}\r|\r\n");
  // Python's open(): universal newlines, before SGLang's strip("\n") (and jinja2's trim_blocks after endfor).
  expect(render(servers.server(CONTENTS, { chatRendering: "sglang", chatTemplate: file }), user("q"))).toBe("[q]\n|");
  expect(render(servers.server(CONTENTS, { chatTemplate: file }), user("q"))).toBe("\n[q]\n|");
});

describe("what SGLang does that is not mirrored is routed by load, never hashed", () => {
  // Every chat of a model SGLang serves with its own conversation template (TemplateManager.load_chat_template).
  const conversationServed = (flags: { chatTemplate?: string; modelPath?: string }) => servers.server(CONTENTS, { chatRendering: "sglang", ...flags });
  const unrenderedCause = (pre: Preprocessor) => {
    const read = readBody({ body: new TextEncoder().encode(JSON.stringify({ model: "m", ...user("q") })) }, pre.rules);
    expect(Array.from(encodeJob(pre, read.job as TokenizeJob))).toEqual([]);
    return read.fields.unrendered;
  };

  test("every chat of a model whose path SGLang guesses a conversation template for, the tokenizer's template notwithstanding", () => {
    const guessed = conversationServed({ modelPath: "lmsys/vicuna-7b-v1.5" });
    expect(unrenderedCause(guessed)).toEqual({ cause: "template_engine", message: expect.stringContaining('"vicuna_v1.1"') });
    expect(() => render(guessed, { ...user("q"), tools: [fn] })).toThrow(ChatUnrenderable);
    // A path it guesses nothing for renders with the Jinja template; vLLM guesses nothing.
    expect(render(conversationServed({ modelPath: "Qwen/Qwen3-8B" }), user("q"))).toBe("[q]");
    expect(render(servers.server(CONTENTS, { modelPath: "lmsys/vicuna-7b-v1.5" }), user("q"))).toBe("[q]");
  });

  test("every chat when --chat-template names a conversation template (no .jinja file); a .jinja one wins over the guess", () => {
    expect(unrenderedCause(conversationServed({ chatTemplate: "chatml" }))).toEqual({ cause: "template_engine", message: expect.stringContaining('"chatml"') });
    const file = join(servers.root, "over-guess.jinja");
    writeFileSync(file, "<{% for m in messages %}{{ m.content }}{% endfor %}>");
    expect(render(conversationServed({ chatTemplate: file, modelPath: "lmsys/vicuna-7b-v1.5" }), user("q"))).toBe("<q>");
  });

  test("a tool schema with a non-standard type name (normalize_json_schema_types rewrites it)", () => {
    const { sglang, vllm } = both("{{ tools | tojson }}");
    const typed = (type: unknown) => ({ ...user("q"), tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { a: { type } } } } }] });
    expect(() => render(sglang, typed("varchar"))).toThrow(ChatUnrenderable);
    expect(() => render(sglang, typed(["string", "int64"]))).toThrow(ChatUnrenderable);
    expect(render(sglang, typed("string"))).toContain('"a": {"type": "string"}');
    expect(render(vllm, typed("varchar"))).toContain('"a": {"type": "varchar"}');
  });

  test("only schemas are walked for type names, as normalize_json_schema_types walks them: not examples or extensions", () => {
    const { sglang } = both("{{ tools | tojson }}");
    const params = (parameters: unknown) => ({ ...user("q"), tools: [{ type: "function", function: { name: "f", parameters } }] });
    // A property named `type` is a schema (under `properties`), and its type is rewritten.
    expect(() => render(sglang, params({ type: "object", properties: { type: { type: "str" } } }))).toThrow(ChatUnrenderable);
    expect(() => render(sglang, params({ type: "array", items: [{ type: "int" }] }))).toThrow(ChatUnrenderable);
    // An example value or an `x-` extension is no schema: left as it is.
    const car = { type: "object", properties: { car: { type: "object", example: { type: "sedan" }, "x-kind": { type: "int" } } } };
    expect(render(sglang, params(car))).toContain('"example": {"type": "sedan"}');
  });

  test("reasoning_effort \"low\" with a template that reads low_effort (reasoning_config.effort_kwarg)", () => {
    const { sglang } = both("{{ low_effort }}");
    expect(() => render(sglang, { ...user("q"), reasoning_effort: "low" })).toThrow(ChatUnrenderable);
    expect(render(sglang, { ...user("q"), reasoning_effort: "low", chat_template_kwargs: { low_effort: false } })).toBe("False");
    expect(render(sglang, { ...user("q"), reasoning_effort: "high" })).toBe("");
  });

  test("the request's reasoning_effort \"low\" counts for low_effort, whatever reasoning_effort the kwargs give the template", () => {
    // `if request.reasoning_effort == "low"`: a default kwarg's reasoning_effort reaches only the template.
    const { sglang } = both("{{ reasoning_effort }}{{ low_effort }}", '{"reasoning_effort": "high"}');
    expect(() => render(sglang, { ...user("q"), reasoning_effort: "low" })).toThrow(ChatUnrenderable);
    expect(render(sglang, user("q"))).toBe("high");
  });

  test("tool results holding media, out of their calls' order (_canonicalize_tool_message_order sorts them)", () => {
    const { sglang } = both(CONTENTS);
    const image = { type: "image_url", image_url: { url: "u" } };
    const call = (id: string) => ({ id, type: "function", function: { name: "f", arguments: "{}" } });
    const chat = (first: string, second: string) => ({
      messages: [
        { role: "user", content: "q" }, { role: "assistant", content: null, tool_calls: [call("a"), call("b")] },
        { role: "tool", tool_call_id: first, content: [image] }, { role: "tool", tool_call_id: second, content: "r" }, { role: "user", content: "s" },
      ],
    });
    expect(() => render(sglang, chat("b", "a"))).toThrow(ChatUnrenderable);
    expect(render(sglang, chat("a", "b"))).toBe("[q][][][r][s]");
  });

  test("tool results are sorted whatever their roles' case, and a null call id leaves the run as it is", () => {
    const { sglang } = both(CONTENTS);
    const image = { type: "image_url", image_url: { url: "u" } };
    const call = (id: string | null) => ({ id, type: "function", function: { name: "f", arguments: "{}" } });
    const chat = (roles: [string, string], ids: [string | null, string], results: [string | null, string | null]) => ({
      messages: [
        { role: "user", content: "q" }, { role: roles[0], content: null, tool_calls: ids.map(call) },
        { role: roles[1], tool_call_id: results[0], content: [image] }, { role: roles[1], tool_call_id: results[1], content: "r" },
      ],
    });
    // The messages are sorted as dumped, their roles lowercased.
    expect(() => render(sglang, chat(["Assistant", "TOOL"], ["a", "b"], ["b", "a"]))).toThrow(ChatUnrenderable);
    // _sort_tool_message_run: `any(call_id is None ...)` returns the run unsorted.
    expect(render(sglang, chat(["assistant", "tool"], [null, "b"], ["b", null]))).toBe("[q][][][r]");
  });
});

test("an input_audio part is an audio part to SGLang's \"openai\" format", () => {
  const { sglang } = both("{% for m in messages %}{% for p in m.content %}<{{ p.type }}>{% endfor %}{% endfor %}");
  // schema.py _to_audio_url_part: input_audio becomes audio_url, which the format keeps as {"type": "audio"}.
  expect(render(sglang, user([{ type: "input_audio", input_audio: { data: "AAAA", format: "wav" } }, { type: "text", text: "t" }]))).toBe("<audio><text>");
});

test("a /v1/responses body is routed by load for SGLang workers; vLLM's are rendered", () => {
  const body = new TextEncoder().encode(JSON.stringify({ input: "hi" }));
  const { sglang, vllm } = both(CONTENTS);
  expect(parseBodyBytes(body, "/v1/responses", sglang.rules)).toMatchObject({ input: { kind: "none" }, unrendered: { cause: "responses_rules" } });
  expect(parseBodyBytes(body, "/v1/responses", vllm.rules).input.kind).toBe("chat");
});

test("vLLM's flags that SGLang has not are reported as ignored under SGLang's rules", () => {
  const flags = { excludeToolsWhenToolChoiceNone: true, chatTemplateContentFormat: "openai", trustRequestChatTemplate: true, defaultChatTemplateKwargs: "{}", responseRole: "model", tokenizerMode: "hf", anthropicInlineSystem: "fold",
    anthropicDisabledThinkingEffort: "low" } as const;
  expect(ignoredRenderingFlags({ ...flags, tokenizerDir: servers.source, chatRendering: "sglang" })).toEqual([
    "--exclude-tools-when-tool-choice-none", "--chat-template-content-format", "--trust-request-chat-template", "--response-role", "--tokenizer-mode", "--anthropic-inline-system",
    "--anthropic-disabled-thinking-effort",
  ].map((flag) => ({ flag, cause: "vllm_only" })));
  // Without a template too, the response role is ignored for being vLLM's, not for want of a template.
  expect(ignoredRenderingFlags({ ...flags, chatRendering: "sglang" })).toContainEqual({ flag: "--response-role", cause: "vllm_only" });
  expect(ignoredRenderingFlags({ ...flags, chatRendering: "sglang" })).toContainEqual({ flag: "--anthropic-inline-system", cause: "vllm_only" });
  expect(ignoredRenderingFlags({ ...flags, chatRendering: "sglang" })).toContainEqual({ flag: "--anthropic-disabled-thinking-effort", cause: "vllm_only" });
  expect(ignoredRenderingFlags({ ...flags, tokenizerDir: servers.source })).toEqual([]);
});
