import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { bpeModelOf, parseTokenizerJson, vocabIdOf } from "../src/fast/bpe-model";
import { compileFastTokenizer } from "../src/fast/fast-tokenizer";
import { adoptTokenizerFiles, loadTokenizerFiles, shareTokenizerFiles } from "../src/tokenizer-files";
import { modelDir, MODELS } from "./reference-tokenizers";

// Whether parseTokenizerJson read the model with its scanner (its vocab is built on first read), not JSON.parse.
const scanned = (json: Record<string, any>) => Object.getOwnPropertyDescriptor(json.model ?? {}, "vocab")?.get !== undefined;

// Both parsers' outcome on `text`: the value (its model's vocabulary in key order) or the error's message.
function outcomes(text: string): [unknown, unknown] {
  const run = (parse: (t: string) => any) => {
    try {
      const json = parse(text);
      return { json, vocabKeys: json?.model?.vocab && Object.keys(json.model.vocab) };
    } catch (err) {
      return { error: `${(err as Error).name}: ${(err as Error).message}` };
    }
  };
  return [run(parseTokenizerJson), run(JSON.parse)];
}

function bpeModelFacts(model: Record<string, any>) {
  const m = bpeModelOf(model);
  return {
    vocab: new Map(m.entries()),
    merges: Array.from(m.merges),
    parts: Array.from({ length: m.merges.length / 3 }, (_, i) => m.mergeParts(i)),
    missing: m.missing,
    some: ["a", "b", "ab", "Ġ", "\"", "\\", "😀", "zz"].map((t) => m.get(t)),
  };
}

describe("parseTokenizerJson on every tokenizer the repository ships or tests with", () => {
  for (const model of MODELS) {
    test(`${model}: the scanned vocab and merges (of the file mapped, as loadTokenizerFiles reads it) are JSON.parse's (of readFileSync's text), and so is the tokenizer`, () => {
      const text = readFileSync(join(modelDir(model), "tokenizer.json"), "utf8");
      const fast = loadTokenizerFiles(modelDir(model)).tokenizerJson as Record<string, any>;
      const plain = JSON.parse(text);
      expect(scanned(fast)).toBe(true);
      const [a, b] = [bpeModelOf(fast.model), bpeModelOf(plain.model)];
      expect(a.missing).toBeNull();
      expect(a.merges).toEqual(b.merges);
      expect(new Map(a.entries())).toEqual(new Map(b.entries()));
      for (let i = 0; i < b.merges.length / 3; i++) if (a.mergeParts(i).join(" ") !== b.mergeParts(i).join(" ")) expect(a.mergeParts(i)).toEqual(b.mergeParts(i));
      // Built on first read for the reference library: the same objects, keys in the same order.
      expect(Object.keys(fast.model.vocab)).toEqual(Object.keys(plain.model.vocab));
      expect(fast).toEqual(plain);
      const text2 = "Hello, world! 1234 — naïve café 😀\n\tdef f(x): return x**2";
      const [ta, tb] = [compileFastTokenizer(fast), compileFastTokenizer(plain)];
      expect(ta.ok && tb.ok && Array.from(ta.tokenizer.encode(text2))).toEqual(tb.ok && Array.from(tb.tokenizer.encode(text2)));
    }, 120_000);
  }
});

describe("a scanned model shared with other threads (shareTokenizerFiles, as a tokenizer pool hands it to its members)", () => {
  for (const model of MODELS) {
    test(`${model}: posted, its tables are shared memory, and adopted, its vocab, merges, file and ids are the file's`, () => {
      const plain = JSON.parse(readFileSync(join(modelDir(model), "tokenizer.json"), "utf8"));
      const posted = structuredClone(shareTokenizerFiles(loadTokenizerFiles(modelDir(model)))); // as workerData is
      const tables = posted.model!.tables!;
      const { count: _, ...vocab } = tables.vocab;
      // Llama 3's (ignore_merges) whole-word table too, built for its byte-level pre-tokenizer.
      const wholeWords = tables.wholeWords;
      expect(wholeWords?.byteLevel ?? null).toEqual(plain.model.ignore_merges ? true : null);
      const { count: _c, ...whole } = wholeWords?.table ?? {};
      const arrays = [...Object.values(vocab), tables.ids, tables.entries, ...Object.values(tables.mergeTable), ...Object.values(whole)];
      expect(arrays.length).toBe(wholeWords ? 14 : 10);
      expect(arrays.every((a) => a.buffer instanceof SharedArrayBuffer)).toBe(true);
      const adopted = adoptTokenizerFiles(posted).tokenizerJson as Record<string, any>;
      expect(scanned(adopted)).toBe(true);
      expect(bpeModelFacts(adopted.model)).toEqual(bpeModelFacts(plain.model));
      if (wholeWords) expect((bpeModelOf(adopted.model).wholeWords(true) as any).keys.buffer instanceof SharedArrayBuffer).toBe(true);
      // " jeho" and "mektedir" are Llama 3 tokens its merges do not make: found in the whole-word table, or not one id.
      const text = "Hello, world! 1234 — naïve café 😀\n\tdef f(x): return x**2 ▁ > </ jeho mektedir";
      const [a, b] = [compileFastTokenizer(adopted), compileFastTokenizer(plain)];
      expect(a.ok && b.ok && Array.from(a.tokenizer.encode(text))).toEqual(b.ok && Array.from(b.tokenizer.encode(text)));
      expect(adopted).toEqual(plain);
    }, 120_000);
  }
});

test("a preprocessor keeps nothing of its decoded tokenizer.json text alive (the scanner's last token once held all of it)", () => {
  // A fresh process, so that its largest string is this tokenizer.json's if anything holds it. Strings cannot be
  // WeakRef targets; a heap snapshot lists the cells a full collection finds live (nodes: id, size, class, flags).
  const preprocessor = new URL("../src/preprocessor.ts", import.meta.url).pathname;
  const dir = modelDir("qwen3");
  const script = `import { createPreprocessor } from ${JSON.stringify(preprocessor)};
    const pre = createPreprocessor({ tokenizerDir: ${JSON.stringify(dir)} });
    const ids = pre.encodeCompletion("Hello, world").length;
    await Bun.sleep(0); // a fresh stack: no pointer left from the load for the collector to take as a root
    const { nodes, nodeClassNames } = Bun.generateHeapSnapshot();
    let largest = 0;
    for (let i = 0; i < nodes.length; i += 4) if (nodeClassNames[nodes[i + 2]] === "string") largest = Math.max(largest, nodes[i + 1]);
    console.log(JSON.stringify({ largest, ids: ids === pre.encodeCompletion("Hello, world").length }));`;
  const run = Bun.spawnSync([process.execPath, "-e", script]);
  expect(run.stderr.toString()).toBe("");
  const { largest, ids } = JSON.parse(run.stdout.toString());
  expect(ids).toBe(true);
  // The text is ~21 MB as UTF-16 (11.4 MB of UTF-8); the preprocessor's own strings are tokens and templates.
  expect(largest).toBeLessThan(Bun.file(join(dir, "tokenizer.json")).size / 4);
}, 60_000);

const doc = (model: string, extra = "") => `{"version":"1.0","added_tokens":[{"id":9,"content":"<s>","special":true}],${extra}"model":${model}}`;
const VOCAB = `{"a":0,"b":1,"ab":2,"Ġ":3,"\\"":4,"\\\\":5,"\\u0120\\u0120":6,"\\ud83d\\ude00":7,"zz":8,"\\"\\\\":10,"😀😀":11}`;

describe("parseTokenizerJson agrees with JSON.parse", () => {
  const cases: Record<string, string> = {
    "pairs": doc(`{"type":"BPE","vocab":${VOCAB},"merges":[["a","b"],["Ġ","\\u0120"],["\\"","\\\\"],["😀","\\ud83d\\ude00"]]}`),
    "strings": doc(`{"type":"BPE","vocab":${VOCAB},"merges":["a b","Ġ Ġ","\\" \\\\","\\ud83d\\ude00 😀"]}`),
    "a space escaped in a string merge": doc(`{"type":"BPE","vocab":${VOCAB},"merges":["a\\u0020b"]}`),
    "pretty-printed, CRLF and tabs": doc(`{\r\n\t"type" : "BPE" ,\r\n\t"vocab" :\r\n {\r\n "a" : 0 ,\n "b" :1, "ab":\t2 } ,\n "merges" : [ [ "a" , "b" ] ]\n}`),
    "merges before the vocabulary": doc(`{"merges":["a b"],"type":"BPE","vocab":{"a":0,"b":1,"ab":2}}`),
    "model first, other keys after": `{"model":{"vocab":{"a":0,"b":1,"ab":2},"merges":[["a","b"]],"type":"BPE","dropout":null},"added_tokens":[],"x":[{"y":"}]\\""}]}`,
    "empty vocabulary and merges": doc(`{"type":"BPE","vocab":{},"merges":[]}`),
    "a token listed twice": doc(`{"type":"BPE","vocab":{"a":0,"b":1,"a":7,"ab":2},"merges":[["a","b"]]}`),
    "integer-like and __proto__ keys": doc(`{"type":"BPE","vocab":{"b":5,"10":1,"0":2,"__proto__":3,"a":4,"ab":6},"merges":[["a","b"]]}`),
    "large ids": doc(`{"type":"BPE","vocab":{"a":0,"b":999999999,"ab":123456789},"merges":[["a","b"]]}`),
    "an id of 10 digits": doc(`{"type":"BPE","vocab":{"a":0,"b":2147483648,"ab":1},"merges":[["a","b"]]}`),
    "no merges (WordPiece-like)": doc(`{"type":"WordPiece","vocab":{"a":0}}`),
    "no vocabulary": doc(`{"type":"BPE","merges":[]}`),
    "no model": `{"added_tokens":[]}`,
    "model null": doc("null"),
    "two models": `{"model":{"vocab":{"a":0},"merges":[]},"model":{"vocab":{"b":1},"merges":[]}}`,
    "two vocabularies": doc(`{"vocab":{"a":0},"vocab":{"b":1},"merges":[]}`),
    "mixed merge forms": doc(`{"vocab":{"a":0,"b":1,"ab":2},"merges":["a b",["a","b"]]}`),
    "a merge of three": doc(`{"vocab":{"a":0,"b":1,"ab":2},"merges":[["a","b","c"]]}`),
    "a merge without a space": doc(`{"vocab":{"a":0,"b":1,"ab":2},"merges":["ab"]}`),
    "a merge's result missing": doc(`{"vocab":{"a":0,"b":1},"merges":[["a","b"]]}`),
    "fractional, exponent and negative ids": doc(`{"vocab":{"a":1.0,"b":1e2,"c":-1,"ab":0},"merges":[]}`),
    "an id of 16 digits": doc(`{"vocab":{"a":1234567890123456},"merges":[]}`),
    "a vocabulary array (Unigram)": doc(`{"type":"Unigram","vocab":[["a",0.5]]}`),
  };
  for (const [name, text] of Object.entries(cases)) {
    test(name, () => {
      const [a, b] = outcomes(text);
      expect(a).toEqual(b);
      const parsed = (a as { json?: any }).json;
      if (parsed?.model?.merges !== undefined && typeof parsed.model.vocab === "object" && !Array.isArray(parsed.model.vocab)) {
        expect(bpeModelFacts(parsed.model)).toEqual(bpeModelFacts(JSON.parse(text).model));
      }
    });
  }

  test("the usual shapes are scanned, escapes and all", () => {
    for (const name of ["pairs", "strings", "large ids", "a space escaped in a string merge", "pretty-printed, CRLF and tabs", "merges before the vocabulary", "model first, other keys after", "a token listed twice", "integer-like and __proto__ keys"]) {
      expect([name, scanned(parseTokenizerJson(cases[name]!))]).toEqual([name, true]);
    }
  });

  test("malformed text fails as JSON.parse fails (every prefix, and each character replaced), never hangs", () => {
    const text = cases.pairs!.slice(0, 60) + cases.strings!.slice(60);
    for (let n = 0; n < text.length; n++) {
      const [a, b] = outcomes(text.slice(0, n));
      expect(a).toEqual(b);
    }
    for (let at = 0; at < text.length; at++) {
      for (const c of ['"', "\\", ",", ":", "]", "}", "[", "{", " ", "\n", "\u0001", "x", "0", "-", ".", "u"]) {
        const mutated = text.slice(0, at) + c + text.slice(at + 1);
        const [a, b] = outcomes(mutated);
        if (!Bun.deepEquals(a, b)) expect([mutated, a]).toEqual([mutated, b]);
      }
    }
    for (const bad of ["\ufeff" + cases.pairs, cases.pairs + " x", cases.pairs!.replace('"a":0', '"a":00'), cases.pairs!.replace('["a","b"]', '["a","b\\x"]')]) {
      const [a, b] = outcomes(bad);
      expect(a).toEqual(b);
    }
  });
});

describe("a scanned vocabulary", () => {
  test("past the table's first size (thousands of short tokens in a small file) still agrees with JSON.parse", () => {
    const tokens = Array.from({ length: 5000 }, (_, i) => i.toString(36));
    const merges = Array.from({ length: 200 }, (_, i) => `["${tokens[i]}","${tokens[i + 1]}"]`).filter((_, i) => tokens.includes(tokens[i]! + tokens[i + 1]!));
    const text = doc(`{"type":"BPE","vocab":{${tokens.map((t, i) => `"${t}":${i}`).join(",")}},"merges":[${merges.join(",")}]}`);
    const parsed = parseTokenizerJson(text);
    expect(scanned(parsed)).toBe(true);
    const m = bpeModelOf(parsed.model);
    expect(tokens.every((t, i) => m.get(t) === i)).toBe(true);
    expect(m.get("zzzz")).toBeUndefined();
    expect(bpeModelFacts(parsed.model)).toEqual(bpeModelFacts(JSON.parse(text).model));
    expect(Object.keys(parsed.model.vocab)).toEqual(Object.keys(JSON.parse(text).model.vocab));
  });

  test("vocabIdOf reads the scan without building the vocab object; a vocab written over it is what is read after", () => {
    const parsed = parseTokenizerJson(doc(`{"type":"BPE","vocab":${VOCAB},"merges":[["a","b"]]}`));
    expect([vocabIdOf(parsed.model, "ab"), vocabIdOf(parsed.model, "😀😀"), vocabIdOf(parsed.model, "nope")]).toEqual([2, 11, undefined]);
    expect(scanned(parsed)).toBe(true); // still a getter: nothing built
    parsed.model.vocab = { a: 5 };
    expect([vocabIdOf(parsed.model, "a"), bpeModelOf({ ...parsed.model, merges: [] }).get("a"), bpeModelOf(parsed.model).get("a")]).toEqual([5, 5, 5]);
    expect(vocabIdOf(undefined, "a")).toBeUndefined();
  });
});
