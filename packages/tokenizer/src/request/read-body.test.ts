import { expect, test } from "bun:test";
import { TooDeep } from "./openai-body";
import { readBody } from "./read-body";
import { ROUTING_TEXT_CHARS } from "./routing-job";

const bytes = (v: unknown) => new TextEncoder().encode(typeof v === "string" ? v : JSON.stringify(v));

test("a body is read into the fields a pick needs and the job to tokenize, cut to the routing bound", () => {
  const long = "word ".repeat(ROUTING_TEXT_CHARS / 2);
  const read = readBody({ body: bytes({ model: "m", cache_salt: "s", messages: [{ role: "user", content: long }] }), path: "/v1/chat/completions" });
  expect(read.fields).toEqual({ model: "m", cacheSalt: "s", batchedPrompts: undefined, kind: "chat" });
  expect(read.rewritten).toBeUndefined();
  const job = read.job as { kind: string; messages: { content: string }[] };
  expect(job.kind).toBe("chat");
  expect(job.messages[0]!.content.length).toBeLessThanOrEqual(ROUTING_TEXT_CHARS);
  expect(readBody({ body: bytes({ prompt: [[1, 2], [3]] }) })).toMatchObject({ fields: { kind: "tokens", batchedPrompts: 2 }, job: new Uint32Array([1, 2]) });
});

test("the rewrite model is spliced in only when the body names another one", () => {
  const body = '{"model": "alias", "prompt": "x"}';
  expect(new TextDecoder().decode(readBody({ body: bytes(body), rewriteModel: "served" }).rewritten)).toBe('{"model": "served", "prompt": "x"}');
  expect(readBody({ body: bytes(body), rewriteModel: "alias" }).rewritten).toBeUndefined();
});

test("a body that may be cut and does not parse is routed by load, saying why; nesting too deep is refused even then", () => {
  expect(readBody({ body: bytes('{"prompt": "a'), maybeCut: true }).fields).toMatchObject({ kind: "none", cut: expect.stringContaining("not JSON") });
  expect(() => readBody({ body: bytes('{"prompt": "a') })).toThrow("not JSON");
  expect(() => readBody({ body: bytes(`{"prompt": ${"[".repeat(200)}`), maybeCut: true })).toThrow(TooDeep);
});
