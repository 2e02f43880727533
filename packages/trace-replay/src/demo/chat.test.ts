// Chat conversations from trace blocks, checked with the real Qwen3 tokenizer the EPP and the workers use.
import { describe, expect, test } from "bun:test";
import { createPreprocessor } from "@kv-epp/tokenizer";
import { DEFAULT_TRACE_PATH, loadTrace, type TraceRecord } from "../trace.ts";
import { blockText, Conversations, spanText } from "./chat.ts";
import { qwen3TokenizerDir } from "./cluster.ts";

const pre = createPreprocessor({ tokenizerDir: qwen3TokenizerDir() });
const chatIds = (messages: { role: string; content: string }[]) => Array.from(pre.encodeChat(messages));
const commonPrefix = (a: number[], b: number[]) => {
  let k = 0;
  while (k < a.length && k < b.length && a[k] === b[k]) k++;
  return k;
};

describe("chat text from trace blocks", () => {
  test("a block is 512 Qwen3 tokens, and blocks tokenize on their own: the tokens of a concatenation are the blocks' tokens", () => {
    const one = Array.from(pre.encodeCompletion(blockText(7)));
    expect(one.length).toBe(512);
    const two = Array.from(pre.encodeCompletion(blockText(7) + blockText(8)));
    expect(two).toEqual([...one, ...pre.encodeCompletion(blockText(8))]);
    expect(spanText([7, 8], 0, 1024)).toBe(blockText(7) + blockText(8));
  });

  test("a block cut short keeps about its share of tokens", () => {
    expect(Math.abs(pre.encodeCompletion(spanText([3, 4], 0, 700)).length - 700)).toBeLessThanOrEqual(2);
  });

  test("requests sharing their first blocks share that prefix of their rendered chat", () => {
    const recs: TraceRecord[] = [
      { timestamp: 0, inputLength: 2000, outputLength: 5, hashIds: [0, 1, 2, 3] },
      { timestamp: 0, inputLength: 1800, outputLength: 5, hashIds: [0, 1, 9, 10] },
    ];
    const chats = new Conversations(recs);
    const [a, b] = [chatIds(chats.messagesOf(0)), chatIds(chats.messagesOf(1))];
    const shared = commonPrefix(a, b);
    // Two blocks of 512 behind the template's user header, and not more.
    expect(shared).toBeGreaterThanOrEqual(1024);
    expect(shared).toBeLessThan(1024 + 8);
  });

  test("a next turn extends the earlier turn's messages, and its rendered chat starts with the earlier one's", () => {
    const recs: TraceRecord[] = [
      { timestamp: 0, inputLength: 1300, outputLength: 200, hashIds: [0, 1, 2] },
      // The earlier turn's partial last block (2) is replaced once the conversation extends it.
      { timestamp: 3, inputLength: 2500, outputLength: 9, hashIds: [0, 1, 5, 6, 7] },
    ];
    const chats = new Conversations(recs);
    const first = chats.messagesOf(0);
    const next = chats.messagesOf(1);
    expect(next.slice(0, first.length)).toEqual(first);
    expect(next.slice(first.length).map((m) => m.role)).toEqual(["assistant", "user"]);
    const [a, b] = [chatIds(first), chatIds(next)];
    expect(b.slice(0, a.length)).toEqual(a);
    // About as long as the trace says (the template adds a few tokens per turn).
    expect(Math.abs(b.length - 2500)).toBeLessThan(25);
  });

  test("on the trace, multi-turn conversations are found and every one grows its earlier turn", async () => {
    const recs = await loadTrace(DEFAULT_TRACE_PATH, 400);
    const chats = new Conversations(recs);
    const all = recs.map((_, i) => chats.messagesOf(i));
    const multi = all.filter((m) => m.length > 1);
    expect(multi.length).toBeGreaterThan(20);
    for (const m of multi) {
      const earlier = all.find((x) => x.length === m.length - 2 && x.every((turn, j) => turn === m[j]));
      expect(earlier).toBeDefined();
    }
  });
});
