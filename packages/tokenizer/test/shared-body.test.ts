import { expect, test } from "bun:test";
import { joinBody } from "../src/index";

test("a body in one chunk is that chunk; one in several is joined once into shared memory, the same bytes", () => {
  const chunk = new TextEncoder().encode('{"prompt":"hi"}');
  expect(joinBody([chunk], chunk.length)).toBe(chunk);
  expect(joinBody([], 0).length).toBe(0);
  const body = joinBody([chunk.subarray(0, 4), chunk.subarray(4, 4), chunk.subarray(4)], chunk.length);
  expect(body.buffer).toBeInstanceOf(SharedArrayBuffer);
  expect(new TextDecoder().decode(body)).toBe('{"prompt":"hi"}');
});
