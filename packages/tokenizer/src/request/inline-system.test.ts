// Inline system messages placed as vLLM's normalize_inline_system places them (vllm/entrypoints/anthropic/
// inline_system.py), then converted as its to_chat_completion_request converts the result. Each expected chat is
// worked out by hand from that code.
import { describe, expect, test } from "bun:test";
import { qwen3TokenizerDir } from "../../test/qwen3-fixture";
import { encodeJob, type TokenizeJob } from "../job";
import { createPreprocessor } from "../preprocessor";
import { anthropicChat } from "./anthropic-body";
import { normalizeInlineSystem, type InlineSystemMode } from "./inline-system";
import { readBody } from "./read-body";

const chat = (mode: InlineSystemMode, messages: unknown[], system: unknown = "Top.") =>
  anthropicChat({ model: "m", max_tokens: 8, system, messages }, { inlineSystem: mode }).messages;

const sys = (content: unknown) => ({ role: "system", content });
const user = (content: unknown) => ({ role: "user", content });
const assistant = (content: unknown) => ({ role: "assistant", content });
const text = (t: string) => ({ type: "text", text: t });
const image = { type: "image", source: { type: "url", url: "http://x/a.png" } };
const toolUse = { type: "tool_use", id: "t1", name: "run", input: {} };
const result = (content: unknown) => ({ type: "tool_result", tool_use_id: "t1", content });

describe("inline system messages", () => {
  test("a body without any is left as it is", () => {
    const messages = [{ role: "user" as const, content: "Hi" }];
    expect(normalizeInlineSystem(undefined, messages, "fold")).toEqual({ leading: "", messages });
  });

  test("leading ones join the system prompt after a blank line; billing headers and empty ones drop out", () => {
    const body = [sys("One."), sys("x-anthropic-billing-header: cc=1"), sys([text("Two."), text("x-anthropic-billing-header: a")]), sys(""), user("Hi")];
    for (const mode of ["preserve", "fold"] as const) {
      expect(chat(mode, body)).toEqual([{ role: "system", content: "Top.\n\nOne.\n\nTwo." }, { role: "user", content: "Hi" }]);
    }
    // A top-level string is not searched for the header.
    expect(chat("preserve", [user("Hi")], "x-anthropic-billing-header: cc=1")[0]).toEqual({ role: "system", content: "x-anthropic-billing-header: cc=1" });
  });

  test("preserve keeps later ones in place as system messages, those with no text dropped", () => {
    expect(chat("preserve", [user("Hi"), assistant("Hello"), sys("Note."), sys("x-anthropic-billing-header: x"), user("Next")])).toEqual([
      { role: "system", content: "Top." },
      { role: "user", content: "Hi" },
      { role: "assistant", content: "Hello" },
      { role: "system", content: "Note." },
      { role: "user", content: "Next" },
    ]);
  });

  test("preserve folds as fold does when the request has no system prompt, neither top-level nor leading", () => {
    const body = [user("Hi"), sys("Note.")];
    expect(chat("preserve", body, null)).toEqual([{ role: "user", content: "Hi\n\nNote." }]);
    expect(chat("preserve", body, [text("x-anthropic-billing-header: x")])).toEqual([{ role: "user", content: "Hi\n\nNote." }]);
    // A leading system message is a system prompt.
    expect(chat("preserve", [sys("Lead."), ...body], null)).toEqual([{ role: "system", content: "Lead." }, { role: "user", content: "Hi" }, { role: "system", content: "Note." }]);
  });

  test("one between a tool_use and its results moves after the results", () => {
    const body = [user("Go"), assistant([toolUse]), sys("Note."), user([result("out")]), assistant("Done")];
    expect(chat("preserve", body)).toEqual([
      { role: "system", content: "Top." },
      { role: "user", content: "Go" },
      { role: "assistant", tool_calls: [{ id: "t1", type: "function", function: { name: "run", arguments: "{}" } }] },
      { role: "tool", tool_call_id: "t1", content: "out" },
      { role: "system", content: "Note." },
      { role: "assistant", content: "Done" },
    ]);
    // Folded, it then joins the tool result it now follows.
    expect(chat("fold", body).slice(3, 4)).toEqual([{ role: "tool", tool_call_id: "t1", content: "out\n\nNote." }]);
    // Held to the end when no results come.
    expect(chat("preserve", [user("Go"), assistant([toolUse]), sys("Note.")]).at(-1)).toEqual({ role: "system", content: "Note." });
  });

  describe("fold", () => {
    test("after a user message: appended to its text, merged into a final text block or added as a block of its own", () => {
      expect(chat("fold", [user("Hi"), sys("A."), sys("B.")])).toEqual([{ role: "system", content: "Top." }, { role: "user", content: "Hi\n\nA.\n\nB." }]);
      expect(chat("fold", [user([image, text("Look")]), sys("A.")])[1]).toEqual({
        role: "user", content: [{ type: "image_url", image_url: { url: "http://x/a.png" } }, { type: "text", text: "Look\n\nA." }],
      });
      expect(chat("fold", [user([text("Look"), image]), sys("A.")])[1]).toEqual({
        role: "user", content: [{ type: "text", text: "Look" }, { type: "image_url", image_url: { url: "http://x/a.png" } }, { type: "text", text: "A." }],
      });
    });

    test("after tool results alone: joined to the last result's content, so that no user turn follows them", () => {
      const folded = (content: unknown) => chat("fold", [user("Go"), assistant([toolUse]), user([result("first"), result(content)]), sys("A.")]).slice(3);
      expect(folded("out")).toEqual([{ role: "tool", tool_call_id: "t1", content: "first" }, { role: "tool", tool_call_id: "t1", content: "out\n\nA." }]);
      expect(folded(null)[1]).toEqual({ role: "tool", tool_call_id: "t1", content: "A." });
      // Merged into a final text item; after another item, a text item of its own (tool text items join with "\n").
      expect(folded([text("x"), text("y")])[1]).toEqual({ role: "tool", tool_call_id: "t1", content: "x\ny\n\nA." });
      expect(folded([text("x"), image])).toEqual([
        { role: "tool", tool_call_id: "t1", content: "first" },
        { role: "tool", tool_call_id: "t1", content: "x\nA." },
        { role: "user", content: [{ type: "image_url", image_url: { url: "http://x/a.png" } }] },
      ]);
    });

    test("after a user message with tool results and text: appended to its text, its results put first", () => {
      expect(chat("fold", [user("Go"), assistant([toolUse]), user([text("Also"), result("out")]), sys("A.")]).slice(3)).toEqual([
        { role: "tool", tool_call_id: "t1", content: "out" },
        { role: "user", content: "Also\n\nA." },
      ]);
    });

    test("after an assistant message: put before the next user message's text, or made a user message when none follows", () => {
      expect(chat("fold", [user("Hi"), assistant("Hello"), sys("A."), sys("B."), user("Next")]).slice(3)).toEqual([{ role: "user", content: "A.\n\nB.\n\nNext" }]);
      expect(chat("fold", [user("Hi"), assistant("Hello"), sys("A."), user([text("Next"), image])])[3]).toEqual({
        role: "user", content: [{ type: "text", text: "A.\n\nNext" }, { type: "image_url", image_url: { url: "http://x/a.png" } }],
      });
      expect(chat("fold", [user("Hi"), assistant("Hello"), sys("A."), user([image])])[3]).toEqual({
        role: "user", content: [{ type: "text", text: "A." }, { type: "image_url", image_url: { url: "http://x/a.png" } }],
      });
      expect(chat("fold", [user("Hi"), assistant("Hello"), sys("A."), assistant("More")]).slice(3)).toEqual([{ role: "user", content: "A." }, { role: "assistant", content: "More" }]);
      expect(chat("fold", [user("Hi"), assistant("Hello"), sys("A."), sys("x-anthropic-billing-header: y"), sys("B.")]).slice(3)).toEqual([{ role: "user", content: "A.\n\nB." }]);
    });

    test("one that comes first after the leading ones, before any user message, opens the first user message", () => {
      expect(chat("fold", [assistant("Hello"), sys("A."), user("Hi")], null)).toEqual([
        { role: "assistant", content: "Hello" },
        { role: "user", content: "A.\n\nHi" },
      ]);
    });
  });
});

describe("a Claude Code-like session on Qwen3: each turn's ids extend the previous turn's", () => {
  const tools = [{ name: "bash", description: "Run a command", input_schema: { type: "object", properties: { command: { type: "string" } } } }];
  // Claude Code sends the conversation again every turn with one more exchange, a fresh billing hash in the system
  // prompt and a system reminder appended at the end.
  const turn = (n: number) => {
    const messages: unknown[] = [user([text("Fix the failing test.")])];
    for (let i = 1; i < n; i++) {
      const call = { type: "tool_use", id: `toolu_${i}`, name: "bash", input: { command: `step ${i}` } };
      messages.push(sys(`Reminder ${i}: todo list has ${i} items.`));
      messages.push(assistant([{ type: "thinking", thinking: `Plan ${i}.`, signature: "s" }, text(`Running step ${i}.`), call]));
      messages.push(user([{ type: "tool_result", tool_use_id: `toolu_${i}`, content: [text(`output ${i}`)] }]));
    }
    messages.push(sys(`Reminder ${n}: todo list has ${n} items.`));
    return {
      model: "m", max_tokens: 4096, stream: true, output_config: { effort: "high" }, tools, messages,
      system: [text(`x-anthropic-billing-header: cc_version=2.1.37.${n}; cch=${n * 7919};`), text("You are Claude Code.")],
    };
  };

  for (const option of ["auto", "fold"] as const) {
    test(`under ${option}`, async () => {
      const pre = createPreprocessor({ tokenizerDir: await qwen3TokenizerDir(), anthropicInlineSystem: option });
      const ids = (n: number) => {
        const read = readBody({ body: new TextEncoder().encode(JSON.stringify(turn(n))), path: "/v1/messages" }, pre.rules);
        return [...encodeJob(pre, read.job as TokenizeJob)];
      };
      let previous = ids(1);
      for (let n = 2; n <= 4; n++) {
        const next = ids(n);
        expect(next.length).toBeGreaterThan(previous.length);
        expect(next.slice(0, previous.length)).toEqual(previous);
        previous = next;
      }
      expect(pre.decode(previous)).toContain("Reminder 4");
    }, 60_000);
  }
});
