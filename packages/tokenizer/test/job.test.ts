import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { encodeJob, newTurnChars, nextTurnJob, type TokenizeJob } from "../src/job";
import { readChatReply } from "../src/request/chat-reply";
import type { RoutedInput } from "../src/request/openai-body";
import { readBody } from "../src/request/read-body";
import { ROUTING_TEXT_CHARS, routingJob } from "../src/request/routing-job";
import type { ChatMessage, ChatOptions, Preprocessor } from "../src/types";
import { chatReplyBody } from "./chat-reply-body";
import { TemplateServers } from "./template-servers";

const chat = (...messages: ChatMessage[]): TokenizeJob => ({ kind: "chat", messages, opts: { addGenerationPrompt: true } });
const m = (role: string, content: ChatMessage["content"]): ChatMessage => ({ role, content });

describe("a chat's new turn (what the worker that served it most likely does not hold)", () => {
  test("from the last reply on: that reply (a template renders it otherwise than it was generated) and what follows", () => {
    expect(newTurnChars(chat(m("system", "s".repeat(10)), m("user", "u".repeat(100)), m("assistant", "a".repeat(20)), m("user", "q".repeat(5))))).toBe(25);
    // Tool results after the reply belong to the turn too.
    expect(newTurnChars(chat(m("user", "u".repeat(100)), m("assistant", "a".repeat(20)), m("tool", "t".repeat(7)), m("user", "q".repeat(5))))).toBe(32);
  });

  test("before a first reply, all of it", () => {
    expect(newTurnChars(chat(m("system", "s".repeat(10)), m("user", "u".repeat(100))))).toBe(110);
  });

  test("a final assistant message being continued (continue_final_message) belongs to the turn, with the reply before it", () => {
    expect(newTurnChars(chat(m("user", "u".repeat(100)), m("assistant", "a".repeat(20)), m("user", "q".repeat(5)), m("assistant", "p".repeat(3))))).toBe(28);
    expect(newTurnChars(chat(m("user", "u".repeat(100)), m("assistant", "p".repeat(3))))).toBe(103);
  });

  test("a chat cut at the routing bound has no new turn among its routed messages", () => {
    const cut: TokenizeJob = { kind: "chat", messages: [m("user", "u".repeat(100))], opts: {}, cut: "in-final" };
    expect(newTurnChars(cut)).toBeUndefined();
    const routed = routingJob({ kind: "chat", messages: [m("user", "u".repeat(ROUTING_TEXT_CHARS + 10)), m("assistant", "a"), m("user", "q")] } as RoutedInput);
    expect(routed).toMatchObject({ kind: "chat", cut: "before-final" });
    const whole = routingJob({ kind: "chat", messages: [m("user", "u".repeat(100)), m("assistant", "a"), m("user", "q")] } as RoutedInput);
    expect(newTurnChars(whole as TokenizeJob)).toBe(2);
  });

  test("content parts count their text (bare strings too); a completion's text has no turns", () => {
    const parts = [{ type: "text", text: "x".repeat(8) }, "y".repeat(4)] as unknown as ChatMessage["content"];
    expect(newTurnChars(chat(m("assistant", "a"), m("user", parts)))).toBe(1 + 9 + 5);
    expect(newTurnChars({ kind: "prompt", text: "hello" })).toBeUndefined();
  });
});

describe("the next turn warmed after a reply", () => {
  test("the conversation, the reply, then an empty user turn rendered with a generation prompt", () => {
    const job = { kind: "chat" as const, messages: [m("user", "q")], opts: { continueFinalMessage: true } };
    expect(nextTurnJob(job, m("assistant", "a"))).toEqual({
      kind: "chat", messages: [m("user", "q"), m("assistant", "a"), m("user", "")], opts: { addGenerationPrompt: true, continueFinalMessage: false },
    });
  });

  test("a reply continuing the final assistant message (continue_final_message) is merged into it: the client resends one message", () => {
    const job = { kind: "chat" as const, messages: [m("user", "q"), m("assistant", "The answer is")], opts: { continueFinalMessage: true, addGenerationPrompt: false } };
    expect(nextTurnJob(job, m("assistant", " 42."))).toEqual({
      kind: "chat", messages: [m("user", "q"), m("assistant", "The answer is 42."), m("user", "")], opts: { addGenerationPrompt: true, continueFinalMessage: false },
    });
  });

  test("a reply that echoes the final assistant message (vLLM's echo) is merged without the echo repeated", () => {
    const continuing = { kind: "chat" as const, messages: [m("user", "q"), m("assistant", "The answer is")], opts: { continueFinalMessage: true, addGenerationPrompt: false }, echo: true as const };
    expect(nextTurnJob(continuing, m("assistant", "The answer is 42."))).toMatchObject({ messages: [m("user", "q"), m("assistant", "The answer is 42."), m("user", "")] });
    // After a user's message nothing is echoed: the reply is the new message as it came.
    const asking = { kind: "chat" as const, messages: [m("user", "q")], opts: {}, echo: true as const };
    expect(nextTurnJob(asking, m("assistant", "a"))).toMatchObject({ messages: [m("user", "q"), m("assistant", "a"), m("user", "")] });
    // A reply not starting with the message's text is not one vLLM echoed: nothing is guessed.
    expect(nextTurnJob(continuing, m("assistant", " 42."))).toBeUndefined();
    // With add_generation_prompt false vLLM echoes a final user message too, its reply a user's: not guessed either.
    const userFinal = { kind: "chat" as const, messages: [m("user", "q")], opts: { addGenerationPrompt: false }, echo: true as const };
    expect(nextTurnJob(userFinal, m("assistant", "q and more"))).toBeUndefined();
  });

  test("a chat's echo reaches its job", () => {
    const input = (echo?: true): RoutedInput => ({ kind: "chat", messages: [m("user", "q")], ...(echo ? { echo } : {}) });
    expect(routingJob(input(true))).toMatchObject({ echo: true });
    expect(routingJob(input())).not.toHaveProperty("echo");
  });

  test("none for a continued final message of content parts: how the client merges the reply into them is not known", () => {
    const parts = [{ type: "text", text: "The answer is" }] as ChatMessage["content"];
    const job = { kind: "chat" as const, messages: [m("user", "q"), m("assistant", parts)], opts: { continueFinalMessage: true } };
    expect(nextTurnJob(job, m("assistant", " 42."))).toBeUndefined();
  });

  test("a reply of tool calls only continuing the final assistant message adds its calls to it, its text (string or parts) as sent", () => {
    const calls = [{ id: "chatcmpl-tool-a", type: "function", function: { name: "f", arguments: "{}" } }];
    const parts = [{ type: "text", text: "Let me look." }] as ChatMessage["content"];
    const next = { role: "tool", tool_call_id: "chatcmpl-tool-a", content: "" };
    const opts = { addGenerationPrompt: true, continueFinalMessage: false };
    // vLLM's JSON reply has content null when the calls came alone; its stream's deltas join to "".
    for (const content of [null, ""]) {
      for (const final of ["Let me look.", parts]) {
        const job = { kind: "chat" as const, messages: [m("user", "q"), m("assistant", final)], opts: { continueFinalMessage: true, addGenerationPrompt: false } };
        expect(nextTurnJob(job, { role: "assistant", content, tool_calls: calls })).toEqual({
          kind: "chat", messages: [m("user", "q"), { role: "assistant", content: final, tool_calls: calls }, next], opts,
        });
      }
    }
    // Text before the calls is joined to the message's text, as a text reply's is.
    const job = { kind: "chat" as const, messages: [m("user", "q"), m("assistant", "Let me look.")], opts: { continueFinalMessage: true } };
    expect(nextTurnJob(job, { role: "assistant", content: "\n", tool_calls: calls })!).toMatchObject({ messages: [m("user", "q"), { role: "assistant", content: "Let me look.\n", tool_calls: calls }, next] });
    // None when the final message made calls of its own: the render stopped at its text, before them.
    const own = { role: "assistant", content: "x", tool_calls: [{ id: "call-0", type: "function", function: { name: "g", arguments: "{}" } }] };
    expect(nextTurnJob({ ...job, messages: [m("user", "q"), own] }, { role: "assistant", content: null, tool_calls: calls })).toBeUndefined();
  });

  test("after tool calls, the reply with its calls, then the first call's result, its text not known yet", () => {
    const calls = [{ id: "chatcmpl-tool-a", type: "function", function: { name: "f", arguments: "{}" } }, { id: "chatcmpl-tool-b", type: "function", function: { name: "g", arguments: "{}" } }];
    const reply = { role: "assistant", content: "", tool_calls: calls };
    expect(nextTurnJob({ kind: "chat", messages: [m("user", "q")], opts: {} }, reply)).toEqual({
      kind: "chat", messages: [m("user", "q"), reply, { role: "tool", tool_call_id: "chatcmpl-tool-a", content: "" }], opts: { addGenerationPrompt: true, continueFinalMessage: false },
    });
  });

  test("none for a chat cut at the routing bound: its next turn is cut at the same place, nothing past it is routed", () => {
    const routed = routingJob({ kind: "chat", messages: [m("user", "u".repeat(ROUTING_TEXT_CHARS + 10)), m("assistant", "a"), m("user", "q")] } as RoutedInput);
    expect(nextTurnJob(routed as Extract<TokenizeJob, { kind: "chat" }>, m("assistant", "b"))).toBeUndefined();
  });
});

// Preprocessors with a test's own template, for the tests that render.
let servers: TemplateServers;
beforeAll(async () => {
  servers = await TemplateServers.open("job-");
});
afterAll(() => servers.close());

describe("vLLM's echo of a final assistant message of content parts", () => {
  // Templates of either content format (content-format.ts): one prints a message's content, one loops over its parts.
  const stringFormat = "{% for m in messages %}{{ m.content }}{% endfor %}";
  const openaiFormat = "{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}";
  const parts = [{ type: "text", text: "The answer" }, { type: "text", text: "" }, { type: "text", text: "is" }] as ChatMessage["content"];
  const job = { kind: "chat" as const, messages: [m("user", "q"), m("assistant", parts)], opts: {}, echo: true as const };
  const warmed = (generated: string) => ({ messages: [m("user", "q"), m("assistant", parts), m("assistant", generated), m("user", "")] });

  test("the echo is taken off the reply as the chat's template has vLLM join the parts: empty texts dropped (string format) or kept (openai format)", () => {
    const string = servers.server(stringFormat);
    expect(nextTurnJob(job, m("assistant", "The answer\nis 42."), string)).toMatchObject(warmed(" 42."));
    expect(nextTurnJob(job, m("assistant", "The answer\n\nis 42."), string)).toBeUndefined();
    const openai = servers.server(openaiFormat);
    expect(nextTurnJob(job, m("assistant", "The answer\n\nis 42."), openai)).toMatchObject(warmed(" 42."));
    expect(nextTurnJob(job, m("assistant", "The answer\nis 42."), openai)).toBeUndefined();
    // --chat-template-content-format decides over the template, as in vLLM.
    expect(nextTurnJob(job, m("assistant", "The answer\n\nis 42."), servers.server(stringFormat, { chatTemplateContentFormat: "openai" }))).toMatchObject(warmed(" 42."));
  });

  test("not guessed without the rules that tell the format, nor for a message with media (placeholders, or a request vLLM fails)", () => {
    expect(nextTurnJob(job, m("assistant", "The answer\nis 42."))).toBeUndefined();
    const media = [{ type: "text", text: "See" }, { type: "image_url", image_url: { url: "https://x/y.png" } }] as ChatMessage["content"];
    const withMedia = { ...job, messages: [m("user", "q"), m("assistant", media)] };
    for (const template of [stringFormat, openaiFormat]) expect(nextTurnJob(withMedia, m("assistant", "See 42."), servers.server(template))).toBeUndefined();
  });
});

describe("a server answering in another role (vLLM's --response-role)", () => {
  // A template that prints every message's role, as chat templates do.
  const template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  type ChatJob = Extract<TokenizeJob, { kind: "chat" }>;
  // A body's job as the EPP reads it.
  const read = (pre: Preprocessor, body: Record<string, unknown>) => readBody({ body: new TextEncoder().encode(JSON.stringify(body)), path: "/v1/chat/completions" }, pre.rules).job as ChatJob;

  test("the next turn warmed from its reply gives the ids of the next turn a client sends, the reply in that role", () => {
    const pre = servers.server(template, { responseRole: "model" });
    const asked = [m("system", "Be brief."), m("user", "What is six times seven?")];
    // vLLM's JSON reply names the role it answered in; the client sends it back so.
    const reply = readChatReply(chatReplyBody({ role: "model", content: "42." }))!;
    const warmed = nextTurnJob(read(pre, { messages: asked }), reply, pre) as ChatJob;
    const next = read(pre, { messages: [...asked, m("model", "42."), m("user", "")] });
    expect(Array.from(encodeJob(pre, warmed))).toEqual(Array.from(encodeJob(pre, next)));
    expect(pre.renderChat(warmed.messages, warmed.opts)).toContain("<|im_start|>model\n42.<|im_end|>");
  });

  test("a continued final message takes the reply whatever the response role: the reply comes in that message's role", () => {
    const pre = servers.server(template, { responseRole: "model" });
    const continuing = { continueFinalMessage: true, addGenerationPrompt: false };
    const job = { kind: "chat" as const, messages: [m("user", "q"), m("assistant", "The answer is")], opts: continuing };
    const reply = readChatReply(chatReplyBody({ role: "assistant", content: " 42." }))!;
    expect(nextTurnJob(job, reply, pre)).toMatchObject({ messages: [m("user", "q"), m("assistant", "The answer is 42."), m("user", "")] });
  });

  test("a reply in another role than the flags say (the EPP's --response-role not the workers') warms nothing", () => {
    const pre = servers.server(template, { responseRole: "model" });
    const reply = readChatReply(chatReplyBody({ role: "assistant", content: "42." }))!;
    expect(reply.role).toBe("assistant");
    expect(nextTurnJob({ kind: "chat", messages: [m("user", "q")], opts: {} }, reply, pre)).toBeUndefined();
  });

  test("echo repeats a final message of the response role, not an assistant's, as vLLM compares the roles", () => {
    const pre = servers.server(template, { responseRole: "model" });
    const job = (final: ChatMessage, opts: ChatOptions = {}) => ({ kind: "chat" as const, messages: [m("user", "q"), final], opts, echo: true as const });
    // A final "model" message is echoed before the reply: taken off, and the reply comes back in that role.
    expect(nextTurnJob(job(m("model", "The answer is")), m("model", "The answer is 42."), pre))
      .toMatchObject({ messages: [m("user", "q"), m("model", "The answer is"), m("model", " 42."), m("user", "")] });
    // A final assistant message is not the reply's role: nothing is echoed, the reply is all generated.
    expect(nextTurnJob(job(m("assistant", "The answer is")), m("model", "Yes."), pre))
      .toMatchObject({ messages: [m("user", "q"), m("assistant", "The answer is"), m("model", "Yes."), m("user", "")] });
    // Continued (add_generation_prompt false, the reply in the final message's role): echoed, then joined to it.
    const continuing = { continueFinalMessage: true, addGenerationPrompt: false };
    expect(nextTurnJob(job(m("model", "The answer is"), continuing), m("model", "The answer is 42."), pre))
      .toMatchObject({ messages: [m("user", "q"), m("model", "The answer is 42."), m("user", "")] });
    // A continued assistant message: the reply comes in its role (add_generation_prompt false), echoed, then joined.
    expect(nextTurnJob(job(m("assistant", "The answer is"), continuing), m("assistant", "The answer is 42."), pre))
      .toMatchObject({ messages: [m("user", "q"), m("assistant", "The answer is 42."), m("user", "")] });
  });

  test("a chat's new turn starts at its last reply in the response role", () => {
    const asked = chat(m("user", "u".repeat(100)), m("model", "a".repeat(20)), m("user", "q".repeat(5)));
    expect(newTurnChars(asked, "model")).toBe(25);
  });
});
