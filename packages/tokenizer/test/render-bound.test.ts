// The bound on a chat template's render (RenderBound in py-template.ts): every shipped template renders a large
// conversation far inside it, and a request's own template that would keep a renderer busy for minutes is routed by
// load, in process and through the pool, whose member then serves the next request as usual.
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ChatUnrenderable, createPreprocessor, encodeJob, readBody, type ChatMessage, type TokenizeJob } from "../src/index";
import { templateTools } from "../src/messages";
import { PyTemplate, renderBound, type RenderCost } from "../src/py-template";
import { MODELS, modelDir, type Model } from "./reference-tokenizers";
import { QWEN3_DIR, qwen3Pools } from "./qwen3-pool";

const NESTED = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}";

const tools = templateTools(
  Array.from({ length: 8 }, (_, i) => ({
    type: "function",
    function: {
      name: `tool_${i}`,
      description: "Looks up the weather of a city.",
      parameters: { type: "object", properties: { city: { type: "string" }, unit: { type: "string", enum: ["c", "f"] } }, required: ["city"] },
    },
  })),
);

/**
 * A system message, then `n` turns alternating user and assistant, ending with the user's; with `toolTurns`, every
 * tenth assistant turn calls a tool and a tool result follows (Gemma 3's template wants strict alternation: none).
 */
function conversation(n: number, text: (i: number) => string, toolTurns: boolean): ChatMessage[] {
  const ms: ChatMessage[] = [{ role: "system", content: text(-1) }];
  for (let i = 0; i < n; i++) {
    if (toolTurns && i % 10 === 5) {
      const call = { id: `c${i}`, type: "function", function: { name: "tool_1", arguments: { city: "Paris" } } };
      ms.push({ role: "assistant", content: "", tool_calls: [call] }, { role: "tool", content: text(i), tool_call_id: `c${i}` });
      i++;
    } else ms.push({ role: i % 2 === 0 ? "user" : "assistant", content: text(i) });
  }
  if (ms.at(-1)!.role !== "user") ms.push({ role: "user", content: text(n) });
  return ms;
}

/** A shipped model's template rendered as vLLM calls it, with what the render cost. */
function renderShipped(model: Model, messages: ChatMessage[]): RenderCost & { text: string } {
  const config = JSON.parse(readFileSync(join(modelDir(model), "tokenizer_config.json"), "utf8"));
  const token = (t: unknown) => (typeof t === "string" ? t : (t as { content?: string } | undefined)?.content);
  const vars = { bos_token: token(config.bos_token), eos_token: token(config.eos_token), documents: null, messages, tools, add_generation_prompt: true };
  const cost: RenderCost = { steps: 0, chars: 0, inputChars: 0 };
  const text = new PyTemplate(config.chat_template).render(vars, cost);
  return { ...cost, text };
}

describe("the shipped templates", () => {
  // Words per message, and empty messages: the shape that costs the most per character of input.
  const shapes = {
    "200 messages of words, with tools": (toolTurns: boolean) => conversation(200, (i) => `message ${i}: ${"lorem ipsum dolor sit amet ".repeat(8)}`, toolTurns),
    "2000 empty messages, with tools": (toolTurns: boolean) => conversation(2000, () => "", toolTurns),
  };
  for (const model of MODELS) {
    for (const [shape, messages] of Object.entries(shapes)) {
      test(`${model}: ${shape} render within half the bound`, () => {
        const cost = renderShipped(model, messages(model !== "gemma3"));
        const bound = renderBound(cost.inputChars);
        expect(cost.text.length).toBeGreaterThan(0);
        expect(cost.steps / bound.steps).toBeLessThan(0.5);
        expect(cost.chars / bound.chars).toBeLessThan(0.5);
      });
    }
  }
});

test("a render's input is measured as about its template and variables' JSON length, without writing that JSON", () => {
  for (const messages of [conversation(200, (i) => `message ${i}: "quoted" ${"lorem ipsum ".repeat(8)}`, true), conversation(2000, () => "", true)]) {
    const cost = renderShipped("qwen3", messages);
    const config = JSON.parse(readFileSync(join(modelDir("qwen3"), "tokenizer_config.json"), "utf8"));
    const json = config.chat_template.length + JSON.stringify({ bos_token: null, eos_token: config.eos_token, documents: null, messages, tools, add_generation_prompt: true }).length;
    expect(cost.inputChars / json).toBeGreaterThan(0.85);
    expect(cost.inputChars / json).toBeLessThan(1.15);
  }
});

describe("a request's own template past the bound", () => {
  const body = (template: string) =>
    new TextEncoder().encode(JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }], chat_template: template }));

  test("is ChatUnrenderable (cause render_bound): no ids, routed by load, never a 400", () => {
    const pre = createPreprocessor({ tokenizerDir: QWEN3_DIR, cache: false, trustRequestChatTemplate: true });
    const thrown = (() => {
      try {
        pre.renderChat([{ role: "user", content: "hi" }], { chatTemplate: NESTED });
      } catch (err) {
        return err;
      }
    })();
    expect(thrown).toBeInstanceOf(ChatUnrenderable);
    expect((thrown as ChatUnrenderable).reason).toBe("render_bound");
    const read = readBody({ body: body(NESTED) });
    expect([...encodeJob(pre, read.job as TokenizeJob)]).toEqual([]);
    expect(read.fields.unrendered).toEqual({ cause: "render_bound", message: expect.stringContaining("passed its bound on evaluation steps") });
  }, 60_000);

  const pools = qwen3Pools();

  test("through the pool: routed by load, and its member answers the next request as usual", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 600_000 }, { trustRequestChatTemplate: true });
    const hostile = await pool.tokenize({ kind: "body", request: { body: body(NESTED) } });
    expect([...hostile.tokens]).toEqual([]);
    expect(hostile.read?.fields.unrendered?.cause).toBe("render_bound");
    const own = "{% for m in messages %}<{{ m.content }}>{% endfor %}";
    const next = await pool.tokenize({ kind: "body", request: { body: body(own) } });
    const pre = createPreprocessor({ tokenizerDir: QWEN3_DIR, trustRequestChatTemplate: true });
    expect(next.read?.fields.unrendered).toBeUndefined();
    expect([...next.tokens]).toEqual([...pre.encodeChat([{ role: "user", content: "hi" }], { chatTemplate: own })]);
  }, 120_000);
});
