// What a chat costs to tokenize for routing is bounded whatever the shape of its text (string content,
// content parts, tools, tool calls and reasoning), and the bounded job routes as the whole request does: its ids are the whole
// request's up to the cut, then only the template's close of the turn.
import { describe, expect, test } from "bun:test";
import { freshWords } from "@kv-epp/testkit";
import { qwen3TokenizerDir } from "../../test/qwen3-fixture";
import { chatRules, type ChatRules } from "../chat-rules";
import { encodeJob, type TokenizeJob } from "../job";
import { createPreprocessor } from "../preprocessor";
import type { ChatMessage, ContentPart } from "../types";
import type { RoutedInput } from "./openai-body";
import { ROUTING_TEXT_CHARS, routingJob } from "./routing-job";

type Chat = Extract<RoutedInput, { kind: "chat" }>;
type ChatJob = Extract<TokenizeJob, { kind: "chat" }>;

const chat = (messages: ChatMessage[], more: Partial<Chat> = {}): Chat => ({ kind: "chat", messages, ...more });
const text = (t: string): ContentPart => ({ type: "text", text: t });
const image = (url = "https://example.com/cat.png"): ContentPart => ({ type: "image_url", image_url: { url } });
/** Distinct words (so no cache makes a long text cheap), a little over `chars` long (they average ~5.9 with their space). */
const words = (chars: number, seed = 1) => freshWords(Math.ceil(chars / 5), seed);

const byLoad = (job: TokenizeJob | Uint32Array) => job instanceof Uint32Array && job.length === 0;

function chatJob(input: Chat, rules?: ChatRules): ChatJob {
  const job = routingJob(input, rules);
  if (job instanceof Uint32Array) throw new Error("routed by load");
  return job as ChatJob;
}

/** The text the job tokenizes for its messages (the template's own text and the tools aside). */
function jobText(job: ChatJob): number {
  let n = 0;
  for (const m of job.messages) {
    if (typeof m.content === "string") n += m.content.length;
    else for (const p of m.content ?? []) n += typeof p.text === "string" ? p.text.length + 1 : 0;
  }
  return n;
}

describe("routingJob bounds content parts as it bounds string content", () => {
  test("a single huge text part is cut to the bound, at a space", () => {
    const huge = words(2_000_000);
    const job = chatJob(chat([{ role: "user", content: [text(huge)] }]));
    const cut = (job.messages[0]!.content as ContentPart[])[0]!.text!;
    expect(cut.length).toBeLessThanOrEqual(ROUTING_TEXT_CHARS);
    expect(cut.length).toBeGreaterThan(ROUTING_TEXT_CHARS - 20);
    expect(huge.startsWith(cut)).toBe(true);
    expect(huge[cut.length]).toBe(" ");
    // vLLM reads a bare string part as text.
    const bare = chatJob(chat([{ role: "user", content: [huge] as unknown as ContentPart[] }]));
    expect((bare.messages[0]!.content as unknown as string[])[0]).toBe(cut);
  });

  test("parts before the cut are kept whole, the part crossing it is cut, the parts and messages after it are dropped", () => {
    const messages = [
      { role: "system", content: "be brief" },
      { role: "user", content: [text("look:"), text(words(2 * ROUTING_TEXT_CHARS)), text("after"), image()] },
      { role: "user", content: "later" },
    ];
    const job = chatJob(chat(messages));
    expect(job.messages.length).toBe(2);
    expect(job.messages[0]).toEqual(messages[0]!);
    const parts = job.messages[1]!.content as ContentPart[];
    expect(parts.length).toBe(2);
    expect(parts[0]).toEqual(text("look:"));
    expect(parts[1]!.text!.length).toBeLessThan(ROUTING_TEXT_CHARS - "be brief look:".length);
    expect(jobText(job)).toBeLessThanOrEqual(ROUTING_TEXT_CHARS);
  });

  test("a mixed text and image message keeps its image in place; an image that crosses the bound is dropped", () => {
    const before = chatJob(chat([{ role: "user", content: [text("see"), image(), text(words(3 * ROUTING_TEXT_CHARS)), image()] }]));
    const parts = before.messages[0]!.content as ContentPart[];
    expect(parts.map((p) => p.type)).toEqual(["text", "image_url", "text"]);
    expect(parts[2]!.text!.length).toBeLessThanOrEqual(ROUTING_TEXT_CHARS);
    // A data URL is no text to tokenize, but it is no smaller for that: past the bound, it ends the routed text.
    const inline = image(`data:image/png;base64,${"A".repeat(2 * ROUTING_TEXT_CHARS)}`);
    const crossing = chatJob(chat([{ role: "user", content: [text("see"), inline, text("this")] }]));
    expect(crossing.messages[0]!.content).toEqual([text("see")]);
  });

  test("a chat within the bound is the request's own messages", () => {
    const messages = [{ role: "user", content: [text("hi"), image(), text("there")] }];
    expect(chatJob(chat(messages)).messages).toBe(messages);
  });

  test("a cut that truncation keeping the tail would undo routes by load; one keeping the head does not", () => {
    const messages = [{ role: "user", content: [text(words(2 * ROUTING_TEXT_CHARS))] }];
    expect(byLoad(routingJob(chat(messages, { truncatePromptTokens: 100 })))).toBe(true);
    expect(byLoad(routingJob(chat(messages, { truncatePromptTokens: 100, truncationSide: "right" })))).toBe(false);
  });
});

describe("routingJob bounds what a message renders besides its content", () => {
  test("an assistant turn whose tool calls and reasoning pass the bound ends the routed messages before it", () => {
    const call = { id: "c1", type: "function", function: { name: "write", arguments: JSON.stringify({ text: words(ROUTING_TEXT_CHARS, 4) }) } };
    const messages: ChatMessage[] = [
      { role: "user", content: "write it" },
      { role: "assistant", content: null, tool_calls: [call], reasoning_content: words(ROUTING_TEXT_CHARS, 5) } as ChatMessage,
      { role: "tool", content: "done", tool_call_id: "c1" } as ChatMessage,
      { role: "user", content: "thanks" },
    ];
    expect(chatJob(chat(messages)).messages).toEqual(messages.slice(0, 1));
    // Nothing left to route on: by load.
    expect(byLoad(routingJob(chat(messages.slice(1))))).toBe(true);
  });

  test("small tool calls count against the bound and are kept", () => {
    const call = { id: "c1", type: "function", function: { name: "search", arguments: '{"q": "cats"}' } };
    const messages: ChatMessage[] = [
      { role: "user", content: "find cats" },
      { role: "assistant", content: "", tool_calls: [call] } as ChatMessage,
      { role: "tool", content: words(2 * ROUTING_TEXT_CHARS, 6), tool_call_id: "c1" } as ChatMessage,
    ];
    const job = chatJob(chat(messages));
    expect(job.messages.slice(0, 2)).toEqual(messages.slice(0, 2));
    expect(jobText(job) + JSON.stringify([call]).length).toBeLessThanOrEqual(ROUTING_TEXT_CHARS + 64);
  });
});

describe("routingJob bounds the tools and documents", () => {
  const tool = (name: string, description: string) => ({ type: "function", function: { name, description, parameters: { type: "object", properties: {} } } });

  test("tools whose JSON alone is past the bound route by load", () => {
    const tools = [tool("search", words(ROUTING_TEXT_CHARS, 2)), tool("fetch", words(ROUTING_TEXT_CHARS, 3))];
    expect(byLoad(routingJob(chat([{ role: "user", content: "hi" }], { tools })))).toBe(true);
  });

  test("tools within the bound leave the messages what remains of it", () => {
    const tools = [tool("search", words(ROUTING_TEXT_CHARS / 2, 2))];
    const job = chatJob(chat([{ role: "user", content: words(2 * ROUTING_TEXT_CHARS) }], { tools }));
    expect(job.opts.tools).toBe(tools);
    expect(jobText(job) + JSON.stringify(tools).length).toBeLessThanOrEqual(ROUTING_TEXT_CHARS);
  });

  test("only the tools the engine's template gets count: none for tool_choice \"none\" under the flag or SGLang, one for a named choice", () => {
    const tools = [tool("search", words(ROUTING_TEXT_CHARS, 2)), tool("fetch", "f")];
    const ask = (toolChoice: unknown) => chat([{ role: "user", content: "hi" }], { tools, toolChoice });
    expect(byLoad(routingJob(ask("none"), chatRules("vllm")))).toBe(true);
    expect(byLoad(routingJob(ask("none"), chatRules("vllm", { excludeToolsWhenToolChoiceNone: true })))).toBe(false);
    expect(byLoad(routingJob(ask("none"), chatRules("sglang")))).toBe(false);
    const named = { type: "function", function: { name: "fetch" } };
    expect(byLoad(routingJob(ask(named), chatRules("sglang")))).toBe(false);
    expect(byLoad(routingJob(ask(named), chatRules("vllm")))).toBe(true);
    // The job still carries every tool: the rendering picks them as the engine does.
    expect(chatJob(ask("none"), chatRules("sglang")).opts.tools).toBe(tools);
  });

  test("vLLM's template gets chat_template_kwargs' tools over the request's, and they count as the request's do", () => {
    const big = [tool("search", words(ROUTING_TEXT_CHARS, 2))];
    const ask = (templateKwargs: Record<string, unknown>, tools?: unknown[]) => chat([{ role: "user", content: "hi" }], { tools, templateKwargs });
    expect(byLoad(routingJob(ask({ tools: big })))).toBe(true);
    expect(byLoad(routingJob(ask({ tools: big }), chatRules("vllm")))).toBe(true);
    // A request's own tools in its kwargs' place: only the kwargs' render.
    expect(byLoad(routingJob(ask({ tools: [tool("fetch", "f")] }, big), chatRules("vllm")))).toBe(false);
    // null or "auto" leave the request's own.
    expect(byLoad(routingJob(ask({ tools: null }, big), chatRules("vllm")))).toBe(true);
    expect(byLoad(routingJob(ask({ tools: "auto" }), chatRules("vllm")))).toBe(false);
    // SGLang's template gets the request's tools whatever the kwargs hold.
    expect(byLoad(routingJob(ask({ tools: big }), chatRules("sglang")))).toBe(false);
  });

  test("the server's default tools (--default-chat-template-kwargs) count when the request's template gets them", () => {
    const big = [tool("search", words(ROUTING_TEXT_CHARS, 2))];
    const rules = chatRules("vllm", { defaultChatTemplateKwargs: JSON.stringify({ tools: big }) });
    const ask = (opts: Record<string, unknown> = {}) => chat([{ role: "user", content: "hi" }], opts);
    expect(byLoad(routingJob(ask(), rules))).toBe(true);
    // The request's own tools (or its kwargs') render instead of the defaults.
    expect(byLoad(routingJob(ask({ tools: [tool("fetch", "f")] }), rules))).toBe(false);
    expect(byLoad(routingJob(ask({ templateKwargs: { tools: [] } }), rules))).toBe(false);
  });

  test("a RAG request's documents count as tools do: past the bound by load, within it the messages get the rest", () => {
    const documents = [{ title: "a", text: words(ROUTING_TEXT_CHARS / 2, 4) }];
    const job = chatJob(chat([{ role: "user", content: words(2 * ROUTING_TEXT_CHARS) }], { templateKwargs: { documents } }));
    expect(job.opts.templateKwargs).toEqual({ documents });
    expect(jobText(job) + JSON.stringify(documents).length).toBeLessThanOrEqual(ROUTING_TEXT_CHARS);
    const many = [...documents, { title: "b", text: words(ROUTING_TEXT_CHARS / 2, 5) }, { title: "c", text: words(ROUTING_TEXT_CHARS / 4, 6) }];
    expect(byLoad(routingJob(chat([{ role: "user", content: "hi" }], { templateKwargs: { documents: many } })))).toBe(true);
    // The server's default documents render when the request sets none (or null), and count the same.
    const rules = chatRules("vllm", { defaultChatTemplateKwargs: JSON.stringify({ documents: many }) });
    expect(byLoad(routingJob(chat([{ role: "user", content: "hi" }]), rules))).toBe(true);
    expect(byLoad(routingJob(chat([{ role: "user", content: "hi" }], { templateKwargs: { documents: null } }), rules))).toBe(true);
    expect(byLoad(routingJob(chat([{ role: "user", content: "hi" }], { templateKwargs: { documents } }), rules))).toBe(false);
  });
});

describe("the bounded job routes as the whole request (Qwen3)", async () => {
  const pre = createPreprocessor({ tokenizerDir: await qwen3TokenizerDir() });
  const close = "<|im_end|>\n<|im_start|>assistant\n";

  /** The ids of the bounded job, and those of the same job over the request's whole messages. */
  function ids(input: Chat): { cut: Uint32Array; whole: Uint32Array } {
    const job = chatJob(input);
    return { cut: encodeJob(pre, job), whole: encodeJob(pre, { ...job, messages: input.messages }) };
  }

  function commonPrefix(a: Uint32Array, b: Uint32Array): number {
    let i = 0;
    while (i < a.length && i < b.length && a[i] === b[i]) i++;
    return i;
  }

  test("a cut text part gives the whole request's ids up to the cut, then the close of the turn", () => {
    const content = [text("read this:"), text(words(2 * ROUTING_TEXT_CHARS)), image(), text("thanks")];
    const { cut, whole } = ids(chat([{ role: "system", content: "be brief" }, { role: "user", content }]));
    expect(cut.length).toBeLessThan(whole.length);
    const same = commonPrefix(cut, whole);
    expect(pre.decode(cut.subarray(same))).toBe(close);
    expect(same).toBeGreaterThan(ROUTING_TEXT_CHARS / 6);
  });

  test("a chat cut past its image routes by the same ids, those before the image", () => {
    const { cut, whole } = ids(chat([{ role: "user", content: [text("what is this?"), image(), text(words(2 * ROUTING_TEXT_CHARS))] }]));
    expect([...cut]).toEqual([...whole]);
    expect(pre.decode(cut)).toContain("what is this");
  });
});
