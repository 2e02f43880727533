import { expect, test } from "bun:test";
import { ReplyCapture } from "./reply-capture.ts";

test("a response body in chunks cut anywhere is kept as received, joined where a pool member reads it without a copy", () => {
  const bytes = new TextEncoder().encode(`data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: "Hello 日本" } }] })}\n\ndata: [DONE]\n\n`);
  const c = new ReplyCapture();
  for (let i = 0; i < bytes.length; i += 7) c.add(bytes.subarray(i, i + 7));
  const body = c.body()!;
  expect(body).toEqual(bytes);
  expect(body.buffer).toBeInstanceOf(SharedArrayBuffer);
  expect(new ReplyCapture().body()).toBeUndefined();
});

test("a reply over the bound is not kept, and says so as it passes the bound", () => {
  const c = new ReplyCapture();
  c.add(new Uint8Array(1 << 20));
  expect(c.overflowed).toBe(false);
  c.add(new Uint8Array(1));
  expect(c.overflowed).toBe(true);
  expect(c.body()).toBeUndefined();
});
