// The WASM JSON field scanner against JSON.parse: whenever it answers, the text is a JSON object and the
// fields are what JSON.parse reads; where it declines (null), JSON.parse decides.
import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { JsonFieldScanner, type JsonField } from "../src/json.ts";

const KEYS = ["model", "prompt", "token_ids"] as const;
const scanner = new JsonFieldScanner(KEYS);
const enc = new TextEncoder();
const dec = new TextDecoder();

function parsed(bytes: Uint8Array): { ok: true; value: unknown } | { ok: false } {
  try {
    return { ok: true, value: JSON.parse(dec.decode(bytes)) };
  } catch {
    return { ok: false };
  }
}

const isUintArray = (v: unknown): v is number[] =>
  Array.isArray(v) && v.every((x) => typeof x === "number" && Number.isInteger(x) && x >= 0 && x <= 0xffffffff);

/** The scanner's answer must agree with JSON.parse wherever it gives one. */
function checkAgainstJsonParse(bytes: Uint8Array): JsonField[] | null {
  const fields = scanner.scan(bytes);
  const ref = parsed(bytes);
  if (fields === null) return null;
  expect(ref.ok).toBe(true);
  const obj = (ref as { value: unknown }).value as Record<string, unknown>;
  expect(typeof obj === "object" && obj !== null && !Array.isArray(obj)).toBe(true);
  KEYS.forEach((k, i) => {
    const f = fields[i]!;
    if (!Object.hasOwn(obj, k)) return expect(f.kind).toBe("absent");
    const v = obj[k];
    expect(f.kind).not.toBe("absent");
    const raw = dec.decode(bytes.subarray((f as { start: number }).start, (f as { end: number }).end));
    expect(JSON.parse(raw)).toEqual(v);
    if (f.kind === "string") expect(typeof v).toBe("string");
    if (f.kind === "uints") expect([...f.values]).toEqual(v as number[]);
    // only arrays of plain digit sequences are decoded; [1.0], [1e3], [-0] stay "other" (JSON.parse has them)
    if (f.kind === "other" && isUintArray(v)) expect(/[.eE-]/.test(raw)).toBe(true);
  });
  return fields;
}

describe("JsonFieldScanner", () => {
  test("reads an OpenAI completions body with token ids", () => {
    const body = enc.encode(JSON.stringify({ model: "m-1", prompt: [1, 22, 4294967295, 0], max_tokens: 16, stream: true }));
    const f = checkAgainstJsonParse(body)!;
    expect(f[0]).toMatchObject({ kind: "string" });
    expect(f[1]!.kind).toBe("uints");
    expect([...(f[1] as { values: Uint32Array }).values]).toEqual([1, 22, 4294967295, 0]);
    expect(f[2]).toEqual({ kind: "absent" });
  });

  test.each([
    ['{"prompt":[]}', "uints"],
    ['{"prompt": [ 1 , 2 ]\n}', "uints"],
    ['{"prompt":[4294967296]}', "other"],
    ['{"prompt":[1.0]}', "other"],
    ['{"prompt":[1e3]}', "other"],
    ['{"prompt":[-1]}', "other"],
    ['{"prompt":[-0]}', "other"],
    ['{"prompt":[[1,2]]}', "other"],
    ['{"prompt":"text \\u00e9 \\" \\\\"}', "string"],
    ['{"prompt":null}', "other"],
    ['{"token_ids":[5],"a":{"b":[true,false,null,-1.5e-3,"x"]}}', "absent"],
  ])("%s", (text, promptKind) => {
    const f = checkAgainstJsonParse(enc.encode(text));
    expect(f).not.toBeNull();
    expect(f![1]!.kind).toBe(promptKind as JsonField["kind"]);
  });

  test.each([
    "",
    "{",
    '{"prompt":[01]}',
    '{"prompt":[1,]}',
    '{"prompt":[1 2]}',
    '{"a":1,}',
    '{"a":tru}',
    '{"a":"\u0001"}',
    '{"a":"\\x"}',
    '{"a":1} x',
    '{"a":-}',
    '{"a":1.}',
    '{"a":1e}',
    '{"a" 1}',
  ])("declines %j (JSON.parse rejects it too)", (text) => {
    const bytes = enc.encode(text);
    expect(scanner.scan(bytes)).toBeNull();
    expect(parsed(bytes).ok).toBe(false);
  });

  test("leaves to JSON.parse what it does not decide: not an object, duplicates, escaped keys, deep nesting, a BOM", () => {
    for (const text of ["[]", '"x"', '{"prompt":[1],"prompt":[2]}', '{"pr\\u006fmpt":[1]}', `{"a":${"[".repeat(300)}${"]".repeat(300)}}`, '\ufeff{"prompt":[1]}']) {
      const bytes = enc.encode(text);
      expect(scanner.scan(bytes)).toBeNull();
      expect(parsed(bytes).ok).toBe(true);
    }
  });

  test("random JSON objects: every answer agrees with JSON.parse", () => {
    const tokens = fc.array(fc.nat({ max: 0xffffffff }), { maxLength: 40 });
    const doc = fc.record(
      {
        model: fc.oneof(fc.string(), fc.integer(), fc.constant(null)),
        prompt: fc.oneof(tokens, fc.string(), fc.array(tokens, { maxLength: 3 }), fc.jsonValue({ maxDepth: 3 })),
        token_ids: tokens,
        extra: fc.jsonValue({ maxDepth: 4 }),
      },
      { requiredKeys: [] },
    );
    fc.assert(
      fc.property(doc, fc.nat({ max: 3 }), (d, spaces) => {
        const bytes = enc.encode(JSON.stringify(d, null, spaces));
        const fields = checkAgainstJsonParse(bytes);
        expect(fields).not.toBeNull(); // JSON.stringify's output is always one the scanner reads
      }),
      { numRuns: 400 },
    );
  });

  test("random bytes and corrupted bodies: never an answer for text JSON.parse rejects", () => {
    const body = JSON.stringify({ model: "m", prompt: [12, 0, 7, 4294967295], x: { y: [1.5, "s\\n", true, null] } });
    const corrupted = fc.tuple(fc.nat({ max: body.length - 1 }), fc.nat({ max: 127 }), fc.boolean()).map(([i, c, insert]) => {
      const ch = String.fromCharCode(c);
      return insert ? body.slice(0, i) + ch + body.slice(i) : body.slice(0, i) + ch + body.slice(i + 1);
    });
    fc.assert(fc.property(corrupted, (text) => void checkAgainstJsonParse(enc.encode(text))), { numRuns: 3000 });
    fc.assert(fc.property(fc.uint8Array({ maxLength: 64 }), (bytes) => void checkAgainstJsonParse(bytes)), { numRuns: 2000 });
  });
});
