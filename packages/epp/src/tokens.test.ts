import { expect, test } from "bun:test";
import { createPreprocessor } from "@kv-epp/tokenizer";
import { createTokenize } from "./tokens.ts";

test("a chat's tools and template kwargs reach the preprocessor, so the ids are the ones the worker renders", () => {
  const pre = createPreprocessor({});
  const seen: unknown[] = [];
  const recording = { ...pre, encodeChat: (m: never, opts?: unknown) => (seen.push(opts), pre.encodeChat(m, opts as never)) };
  const tokenize = createTokenize(recording as typeof pre);
  const messages = [{ role: "user", content: "hello" }];
  const ids = tokenize({ kind: "chat", messages, tools: [{ type: "function" }], templateKwargs: { enable_thinking: false } });
  expect(seen).toEqual([{ tools: [{ type: "function" }], templateKwargs: { enable_thinking: false } }]);
  expect(Array.from(ids)).toEqual(Array.from(pre.encodeChat(messages, { tools: [{ type: "function" }], templateKwargs: { enable_thinking: false } })));
});
