// The vLLM server flags that change the prompt a chat renders as, each rendered here with and without the flag. The
// expected texts are what vLLM's code path gives (vllm/renderers/online_renderer.py render_chat / render_responses,
// params.py ChatParams, hf.py resolve_chat_template), written out by hand for templates small enough to read.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { ChatTemplateError, ignoredRenderingFlags, type Preprocessor, type PreprocessorOptions } from "../src/index";
import { render, TemplateServers } from "./template-servers";

// Prints the tools it gets, then each message's content.
const TOOLS_TEMPLATE = "{% if tools %}T{{ tools | length }}:{{ tools[0].function.name }};{% endif %}{% for m in messages %}[{{ m.content }}]{% endfor %}";
const tools = [{ type: "function", function: { name: "f", parameters: { type: "object" } } }];

let servers: TemplateServers;
let root: string;
let source: string;
beforeAll(async () => {
  servers = await TemplateServers.open("server-flags-");
  ({ root, source } = servers);
});
afterAll(() => servers.close());

/** A preprocessor of Qwen3's vocabulary with `template` as its chat template, built with the server's `flags`. */
const server = (template: string, flags: Omit<PreprocessorOptions, "tokenizerDir"> = {}): Preprocessor => servers.server(template, flags);

describe("--exclude-tools-when-tool-choice-none", () => {
  const chat = { messages: [{ role: "user", content: "hi" }], tools };

  test("without it, a tool_choice of \"none\" still renders the tools (vLLM's tool_dicts are the request's)", () => {
    const pre = server(TOOLS_TEMPLATE);
    expect(render(pre, { ...chat, tool_choice: "none" })).toBe("T1:f;[hi]");
  });

  test("with it, a tool_choice of \"none\" renders with tools=None; any other tool_choice keeps them", () => {
    const pre = server(TOOLS_TEMPLATE, { excludeToolsWhenToolChoiceNone: true });
    expect(render(pre, { ...chat, tool_choice: "none" })).toBe("[hi]");
    expect(render(pre, { ...chat, tool_choice: "auto" })).toBe("T1:f;[hi]");
    expect(render(pre, chat)).toBe("T1:f;[hi]");
    // A Responses request too (construct_tool_dicts): its function tools are flat.
    const responses = { input: "hi", tools: [{ type: "function", name: "f", parameters: { type: "object" } }] };
    expect(render(pre, { ...responses, tool_choice: "none" }, "/v1/responses")).toBe("[hi]");
    expect(render(pre, responses, "/v1/responses")).toBe("T1:f;[hi]");
  });
});

describe("chat_template_kwargs beside the request's own fields (build_chat_params, then with_defaults)", () => {
  const chat = { messages: [{ role: "user", content: "hi" }] };
  const own = [{ type: "function", function: { name: "g" } }, { type: "function", function: { name: "h" } }];

  test("its tools win over the request's and reach the template as given; null or \"auto\" leave the request's", () => {
    const pre = server(TOOLS_TEMPLATE);
    expect(render(pre, { ...chat, chat_template_kwargs: { tools: own } })).toBe("T2:g;[hi]");
    expect(render(pre, { ...chat, tools, chat_template_kwargs: { tools: own } })).toBe("T2:g;[hi]");
    expect(render(pre, { ...chat, tools, chat_template_kwargs: { tools: null } })).toBe("T1:f;[hi]");
    expect(render(pre, { ...chat, tools, chat_template_kwargs: { tools: "auto" } })).toBe("T1:f;[hi]");
    // Not dumped as the request's are (no description or parameters added), and kept under a tool_choice of "none".
    const printed = server("{{ tools | tojson }}", { excludeToolsWhenToolChoiceNone: true });
    expect(render(printed, { ...chat, tool_choice: "none", chat_template_kwargs: { tools: own } })).toBe(JSON.stringify(own).replaceAll(",", ", ").replaceAll(":", ": "));
  });

  test("kwargs' tools that are no list of objects are refused as transformers refuses them (a 400)", () => {
    const pre = server(TOOLS_TEMPLATE);
    expect(() => render(pre, { ...chat, chat_template_kwargs: { tools: "f" } })).toThrow(ChatTemplateError);
    expect(() => render(pre, { ...chat, chat_template_kwargs: { tools: ["f"] } })).toThrow(ChatTemplateError);
    expect(render(pre, { ...chat, chat_template_kwargs: { tools: [] } })).toBe("[hi]");
  });

  test("--default-chat-template-kwargs' tools render a request without any, under the request's own and its kwargs'", () => {
    const pre = server(TOOLS_TEMPLATE, { defaultChatTemplateKwargs: JSON.stringify({ tools: own }) });
    expect(render(pre, chat)).toBe("T2:g;[hi]");
    expect(render(pre, { ...chat, tools })).toBe("T1:f;[hi]");
    expect(render(pre, { ...chat, chat_template_kwargs: { tools: [own[1]] } })).toBe("T1:h;[hi]");
  });

  test("the request's add_generation_prompt and continue_final_message win; the kwargs' give the template no variable", () => {
    const pre = server("{{ add_generation_prompt }}|{{ continue_final_message is defined }}|{{ tokenize is defined }}|{{ messages[0].content }}");
    expect(render(pre, { ...chat, chat_template_kwargs: { add_generation_prompt: false, continue_final_message: true, tokenize: true } })).toBe("True|False|False|hi");
    expect(render(pre, { ...chat, add_generation_prompt: false, chat_template_kwargs: { add_generation_prompt: true } })).toBe("False|False|False|hi");
  });
});

describe("--chat-template", () => {
  const chat = { messages: [{ role: "user", content: "hi" }] };
  const OVERRIDE = "<{% for m in messages %}{{ m.role }}:{{ m.content }}{% endfor %}{% if tools %}+{{ tools | length }}{% endif %}>";

  test("without it, the tokenizer's template renders", () => {
    expect(render(server(TOOLS_TEMPLATE), chat)).toBe("[hi]");
  });

  test("the template itself (a value that opens as no file and holds a brace) replaces the tokenizer's, for a chat with tools too", () => {
    const pre = server(TOOLS_TEMPLATE, { chatTemplate: OVERRIDE });
    expect(render(pre, chat)).toBe("<user:hi>");
    expect(render(pre, { ...chat, tools })).toBe("<user:hi+1>");
  });

  test("a file's path renders with the file's text; a path-like value that opens as no file is refused", () => {
    const file = join(root, "override.jinja");
    writeFileSync(file, OVERRIDE);
    expect(render(server(TOOLS_TEMPLATE, { chatTemplate: file }), chat)).toBe("<user:hi>");
    expect(() => server(TOOLS_TEMPLATE, { chatTemplate: join(root, "missing.jinja") })).toThrow(/looks like a file path/);
  });
});

describe("--chat-template-content-format", () => {
  const chat = { messages: [{ role: "user", content: [{ type: "text", text: "a" }, { type: "text", text: "b" }] }] };
  // Loops over a message's content: "openai" detected. Reads it whole: "string" detected.
  const LOOPS = "{% for m in messages %}{% if m.content is string %}S:{{ m.content }}{% else %}P:{% for p in m.content %}{{ p.text }}|{% endfor %}{% endif %}{% endfor %}";
  const READS = "{% for m in messages %}{% if m.content is string %}S:{{ m.content }}{% else %}P{{ m.content | length }}{% endif %}{% endfor %}";

  test("auto (the default) detects the format on the template", () => {
    expect(render(server(LOOPS), chat)).toBe("P:a|b|");
    expect(render(server(READS), chat)).toBe("S:a\nb");
    expect(render(server(READS, { chatTemplateContentFormat: "auto" }), chat)).toBe("S:a\nb");
  });

  test("string or openai forces that shape whatever the template reads: text parts joined by newlines, or the parts", () => {
    expect(render(server(LOOPS, { chatTemplateContentFormat: "string" }), chat)).toBe("S:a\nb");
    expect(render(server(READS, { chatTemplateContentFormat: "openai" }), chat)).toBe("P2");
    // A string content becomes one text part under "openai" (vLLM wraps it before parsing).
    expect(render(server(LOOPS, { chatTemplateContentFormat: "openai" }), { messages: [{ role: "user", content: "c" }] })).toBe("P:c|");
  });
});

describe("--trust-request-chat-template", () => {
  const chat = { messages: [{ role: "user", content: "hi" }] };
  const OWN = "({% for m in messages %}{{ m.content }}{% endfor %}{% if chat_template is defined %}!{% endif %})";
  const SERVER = "<{{ messages[0].content }}>";
  const refused = "Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template.";

  test("without it, a request bringing a template is refused with vLLM's message (400), one with a null template is not", () => {
    const pre = server(TOOLS_TEMPLATE);
    expect(() => render(pre, { ...chat, chat_template: OWN })).toThrow(refused);
    expect(() => render(pre, { ...chat, chat_template: "" })).toThrow(refused);
    expect(() => render(pre, { ...chat, chat_template_kwargs: { chat_template: OWN } })).toThrow(refused);
    expect(() => render(pre, { input: "hi", chat_template_kwargs: { chat_template: OWN } }, "/v1/responses")).toThrow(refused);
    expect(render(pre, { ...chat, chat_template: null, chat_template_kwargs: { chat_template: null } })).toBe("[hi]");
    expect(() => render(pre, { ...chat, chat_template: 1 })).toThrow("chat_template must be a string");
  });

  test("with it, the request's chat_template wins, then the server's --chat-template, then chat_template_kwargs' own", () => {
    const trusted = server(TOOLS_TEMPLATE, { trustRequestChatTemplate: true });
    // The template gets no `chat_template` variable: apply_chat_template takes it as the template.
    expect(render(trusted, { ...chat, chat_template: OWN })).toBe("(hi)");
    expect(render(trusted, { ...chat, chat_template_kwargs: { chat_template: OWN } })).toBe("(hi)");
    expect(render(trusted, { input: "hi", chat_template_kwargs: { chat_template: OWN } }, "/v1/responses")).toBe("(hi)");
    // An empty chat_template or an "auto" one in the kwargs leaves the server's.
    expect(render(trusted, { ...chat, chat_template: "" })).toBe("[hi]");
    expect(render(trusted, { ...chat, chat_template_kwargs: { chat_template: "auto" } })).toBe("[hi]");
    const withServer = server(TOOLS_TEMPLATE, { trustRequestChatTemplate: true, chatTemplate: SERVER });
    expect(render(withServer, { ...chat, chat_template: OWN })).toBe("(hi)");
    expect(render(withServer, { ...chat, chat_template_kwargs: { chat_template: OWN } })).toBe("<hi>");
  });

  test("the request's template decides the content format, and is compiled once per text, a few texts kept", () => {
    const trusted = server(TOOLS_TEMPLATE, { trustRequestChatTemplate: true });
    const parts = { messages: [{ role: "user", content: [{ type: "text", text: "a" }, { type: "text", text: "b" }] }] };
    const loops = "{% for m in messages %}{% for p in m.content %}{{ p.text }}|{% endfor %}{% endfor %}";
    expect(render(trusted, { ...parts, chat_template: loops })).toBe("a|b|");
    expect(render(trusted, { ...parts, chat_template: "{{ messages[0].content }}" })).toBe("a\nb");
    // A template only in chat_template_kwargs renders, but the format is the server template's (ChatParams.chat_template):
    // served by one that loops over parts (openai), the content stays two parts; as the request's own, it is a string.
    const served = server(loops, { trustRequestChatTemplate: true });
    const length = "{{ messages[0].content | length }}";
    expect(render(served, { ...parts, chat_template_kwargs: { chat_template: length } })).toBe("2");
    expect(render(served, { ...parts, chat_template: length })).toBe("3");
    const kept = (trusted as unknown as { requestTemplates: { size: number } }).requestTemplates;
    for (let i = 0; i < 40; i++) expect(render(trusted, { ...chat, chat_template: `${i}{{ messages[0].content }}` })).toBe(`${i}hi`);
    expect(kept.size).toBeLessThanOrEqual(16);
    // A large template renders but is not kept.
    const before = kept.size;
    const large = `${"{# pad #}".repeat(10_000)}<{{ messages[0].content }}>`;
    expect(render(trusted, { ...chat, chat_template: large })).toBe("<hi>");
    expect(kept.size).toBe(before);
  });

  test("a range past jinja2's sandbox bound (100000) raises as the sandbox does (a 400), never builds the list", () => {
    const trusted = server(TOOLS_TEMPLATE, { trustRequestChatTemplate: true });
    expect(render(trusted, { ...chat, chat_template: "{{ range(3) | length }}" })).toBe("3");
    expect(render(trusted, { ...chat, chat_template: "{{ range(100000) | length }}" })).toBe("100000");
    expect(() => render(trusted, { ...chat, chat_template: "{% for i in range(1000000000) %}x{% endfor %}" })).toThrow(ChatTemplateError);
    expect(() => render(trusted, { ...chat, chat_template: "{{ range(0, 300000, 2) | length }}" })).toThrow(/Range too big/);
  });
});

test("without a tokenizer directory every rendering flag set is named as ignored (the byte-level fallback has no template) but the response role (it renders roles) and the inline system mode (it converts Messages bodies)", () => {
  const flags = { defaultChatTemplateKwargs: "{}", chatTemplate: "{{ x }}", excludeToolsWhenToolChoiceNone: true, chatTemplateContentFormat: "openai", trustRequestChatTemplate: true, responseRole: "model", tokenizerMode: "mistral", anthropicInlineSystem: "preserve" } as const;
  expect(ignoredRenderingFlags(flags)).toEqual([
    "--default-chat-template-kwargs", "--chat-template", "--exclude-tools-when-tool-choice-none", "--chat-template-content-format", "--trust-request-chat-template", "--tokenizer-mode",
  ].map((flag) => ({ flag, cause: "no_template" })));
  expect(ignoredRenderingFlags({ chatTemplateContentFormat: "auto", excludeToolsWhenToolChoiceNone: false, responseRole: "assistant", tokenizerMode: "auto" })).toEqual([]);
  expect(ignoredRenderingFlags({ ...flags, tokenizerDir: source })).toEqual([]);
});
