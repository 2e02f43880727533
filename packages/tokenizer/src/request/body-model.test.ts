import { expect, test } from "bun:test";
import fc from "fast-check";
import { parseJsonKeepingFloats } from "../py-values";
import { rewriteBodyModel } from "./body-model";

const enc = new TextEncoder();
const dec = new TextDecoder();
const rewrite = (body: string, model: string) => dec.decode(rewriteBodyModel(enc.encode(body), model));

test("the model value is replaced in place; every other byte stays as the client wrote it", () => {
  expect(rewrite('{ "n": 1.0, "model" :"a\\"b", "x": "é" }', "m/é")).toBe('{ "n": 1.0, "model" :"m/é", "x": "é" }');
  expect(rewrite('{"model":"a"}', 'q"uote')).toBe('{"model":"q\\"uote"}');
});

test("a body naming no model gets it as its first member, an empty object too", () => {
  expect(rewrite(' {\n "prompt": "x"}', "m")).toBe(' {"model":"m",\n "prompt": "x"}');
  expect(rewrite("{ }", "m")).toBe('{"model":"m" }');
});

// What vLLM reads (Python's json): floats stay floats, integers keep every digit. Parsed here the same way.
const asPython = (json: string) => parseJsonKeepingFloats(json);
// Numbers JSON.parse and JSON.stringify would alter: a tool schema's `1.0` and `1e-05` (printed by a template's
// tojson), int64 bounds and a seed past 2^53.
const numbers = '"seed": 18446744073709551615, "tools": [{"type": "function", "function": {"name": "f", "parameters": ' +
  '{"type": "object", "properties": {"x": {"type": "number", "minimum": 1.0, "multipleOf": 1e-05}, ' +
  '"n": {"type": "integer", "maximum": 9223372036854775807, "minimum": -9223372036854775808}}}}}]';

test("a key written with escapes has its value spliced: every number reaches the model server as written", () => {
  const body = `{"mod\\u0065l": "a", ${numbers}}`;
  const out = rewrite(body, "m");
  expect(out).toBe(body.replace('"a"', '"m"'));
  expect(asPython(out)).toEqual({ ...(asPython(body) as object), model: "m" });
});

test("a model key given twice has every value spliced, so the last (Python's json's pick) names the model too", () => {
  const body = `{"model": "a", ${numbers}, "model": "b"}`;
  const out = rewrite(body, "m");
  expect(out).toBe(`{"model": "m", ${numbers}, "model": "m"}`);
  expect(asPython(out)).toEqual({ ...(asPython(body) as object), model: "m" });
  // Escaped and plain, and a `model` nested deeper, which is not the request's.
  expect(rewrite('{"model":"a","x":{"model":"keep"},"mod\\u0065l":"b"}', "m")).toBe('{"model":"m","x":{"model":"keep"},"mod\\u0065l":"m"}');
});

test("a body past 4 MiB is spliced too, its numbers as written", () => {
  const prompt = "x".repeat(5 * 1024 * 1024);
  const body = `{"model": "a", "prompt": "${prompt}", ${numbers}}`;
  const out = rewrite(body, "m");
  expect(out.length).toBe(body.length);
  expect(out).toBe(body.replace('"a"', '"m"'));
  expect(rewrite(`{"prompt": "${prompt}", ${numbers}}`, "m")).toBe(`{"model":"m","prompt": "${prompt}", ${numbers}}`);
});

test("any object rewritten parses to the same object with `model` set", () => {
  fc.assert(
    fc.property(fc.dictionary(fc.string(), fc.jsonValue()), fc.string(), (o, m) => {
      const out = JSON.parse(rewrite(JSON.stringify(o), m));
      expect(out).toEqual(JSON.parse(JSON.stringify({ ...o, model: m })));
    }),
  );
});
