import { expect, test } from "bun:test";
import fc from "fast-check";
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

test("a body the scanner leaves to JSON.parse (an escaped key, model given twice) is the same document with the model set", () => {
  expect(JSON.parse(rewrite('{"mod\\u0065l": "a", "p": [1]}', "m"))).toEqual({ model: "m", p: [1] });
  expect(JSON.parse(rewrite('{"model": "a", "model": "b"}', "m"))).toEqual({ model: "m" });
});

test("a body past the scan bound is the same document with the model set", () => {
  const big = JSON.stringify({ model: "a", prompt: "x".repeat(5 * 1024 * 1024) });
  const out = JSON.parse(rewrite(big, "m"));
  expect(out.model).toBe("m");
  expect(out.prompt.length).toBe(5 * 1024 * 1024);
});

test("any object rewritten parses to the same object with `model` set", () => {
  fc.assert(
    fc.property(fc.dictionary(fc.string(), fc.jsonValue()), fc.string(), (o, m) => {
      const out = JSON.parse(rewrite(JSON.stringify(o), m));
      expect(out).toEqual(JSON.parse(JSON.stringify({ ...o, model: m })));
    }),
  );
});
