import { expect, test } from "bun:test";
import fc from "fast-check";
import { ResponseModelName } from "./model-rewrite.ts";

const enc = new TextEncoder();
const dec = new TextDecoder();

test("the response's model is mapped back wherever the chunks split it, and nothing else changes", () => {
  const body = 'data: {"model":"served-x","a":1}\n\ndata: {"model": "served-x"}\n\n{"model":"served-xy"} "model":"serv';
  const want = body.replaceAll('"model":"served-x"', '"model":"alias"').replace('"model": "served-x"', '"model": "alias"');
  fc.assert(
    fc.property(fc.uniqueArray(fc.integer({ min: 1, max: body.length - 1 }), { maxLength: 8 }), (cuts) => {
      const at = [0, ...cuts.sort((a, b) => a - b), body.length];
      const m = new ResponseModelName("served-x", "alias");
      let out = "";
      for (let i = 1; i < at.length; i++) out += dec.decode(m.map(enc.encode(body.slice(at[i - 1], at[i])), i === at.length - 1));
      expect(out).toBe(want);
    }),
  );
});

test("bytes held back for a possible split field come out on release", () => {
  const m = new ResponseModelName("served", "alias");
  expect(dec.decode(m.map(enc.encode('{"id":1,"model":"ser'), false))).toBe('{"id":1,');
  expect(dec.decode(m.release())).toBe('"model":"ser');
});

test("a body of many fields in both spellings, some overlapping, is mapped as a left-to-right replace", () => {
  // The served name "model" lets one spelling's field begin inside the other's: the leftmost one is mapped.
  const pieces = ['"model":"model"', '"model": "model"', ':"model"', ' "model"', "data: {", "}\n\n", '"mod'];
  fc.assert(
    fc.property(fc.array(fc.constantFrom(...pieces), { maxLength: 400 }), (picked) => {
      const body = picked.join("");
      const m = new ResponseModelName("model", "alias");
      expect(dec.decode(m.map(enc.encode(body), true))).toBe(body.replace(/"model":( ?)"model"/g, '"model":$1"alias"'));
    }),
  );
});

test("a chunk with nothing to map nor hold back is returned as it came", () => {
  const m = new ResponseModelName("served", "alias");
  const chunk = enc.encode('data: {"id":1,"choices":[]}\n\n');
  expect(m.map(chunk, false)).toBe(chunk);
  expect(m.map(chunk, true)).toBe(chunk);
});
