import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { writeFileSync } from "node:fs";
import { tempDir } from "@kv-epp/testkit";
import { join } from "node:path";
import { createPreprocessor, SegmentCache } from "../src/index";

describe("SegmentCache", () => {
  test("evicts the least recently used entry first", () => {
    const cache = new SegmentCache({ maxEntries: 2 });
    cache.set("a", Uint32Array.of(1));
    cache.set("b", Uint32Array.of(2));
    cache.get("a");
    cache.set("c", Uint32Array.of(3));
    expect(cache.get("b")).toBeUndefined();
    expect(cache.get("a")).toEqual(Uint32Array.of(1));
    expect(cache.stats()).toMatchObject({ entries: 2, evictions: 1, hits: 2, misses: 1 });
  });

  test("cached keys do not keep the (much larger) texts they were sliced from alive", () => {
    // Measured in a child process: in the shared test process other files' buffers and servers move
    // the heap by tens of MB (this test once read +50 MB that were not its own).
    const retained = (pin: boolean): number => {
      const script = `
        import { heapStats } from "bun:jsc";
        import { SegmentCache } from ${JSON.stringify(join(import.meta.dir, "../src/index"))};
        // The key's copy taken through the optimizing compilers first (a copy that read as one only in the
        // interpreter would pass this test and not the EPP's).
        const warm = new SegmentCache({ maxEntries: 64 });
        for (let i = 0; i < 100_000; i++) warm.set("k" + i + "x".repeat(i % 50), Uint32Array.of(1));
        const cache = new SegmentCache();
        const pinned = [];
        Bun.gc(true);
        const before = heapStats().extraMemorySize;
        for (let i = 0; i < 200; i++) {
          const conversation = \`turn \${i} \`.repeat(20_000) + "日"; // ~400 KB as UTF-16
          conversation.charCodeAt(1000); // one buffer of its own (a rope until read), as a rendered text is
          cache.set(conversation.slice(100, 400), Uint32Array.of(i));
          if (${pin}) pinned.push(conversation);
        }
        Bun.gc(true);
        if (cache.stats().entries !== 200) throw new Error("entries " + cache.stats().entries);
        console.log(heapStats().extraMemorySize - before);
      `;
      const r = Bun.spawnSync([process.execPath, "-e", script], { stdout: "pipe", stderr: "pipe" });
      if (r.exitCode !== 0) throw new Error(r.stderr.toString());
      return Number(r.stdout.toString().trim());
    };
    // The control shows the measure sees pinned texts (~55 MB here); unpinned read ~0.3 MB.
    const pinned = retained(true), unpinned = retained(false);
    expect(pinned).toBeGreaterThan(40 * 1024 * 1024);
    expect(unpinned).toBeLessThan(10 * 1024 * 1024);
  });

  test("an entry larger than maxBytes is not kept and does not flush the others", () => {
    const cache = new SegmentCache({ maxBytes: 1024 });
    cache.set("small", Uint32Array.of(1));
    cache.set("big", new Uint32Array(1000));
    expect(cache.get("big")).toBeUndefined();
    expect(cache.get("small")).toEqual(Uint32Array.of(1));
  });
});

// A tiny tokenizer whose pre-tokenizer depends on the section position (Metaspace, prepend_scheme "first": only the
// first section before any added token gets "▁" prepended). Segmenting must keep that context to stay exact.
function firstSectionSensitiveTokenizer(): string {
  const dir = tempDir("metaspace-tokenizer-");
  const vocab: Record<string, number> = { "<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3, a: 4, b: 5, "▁a": 6, ab: 7 };
  writeFileSync(join(dir, "tokenizer.json"), JSON.stringify({
    added_tokens: [
      { id: 1, content: "<s>", special: true, lstrip: false, rstrip: false, single_word: false, normalized: false },
      { id: 2, content: "</s>", special: true, lstrip: false, rstrip: false, single_word: false, normalized: false },
    ],
    normalizer: null,
    pre_tokenizer: { type: "Metaspace", replacement: "▁", prepend_scheme: "first", split: true },
    post_processor: { type: "TemplateProcessing", single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [], special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } } },
    decoder: null,
    model: { type: "BPE", vocab, merges: ["▁ a", "a b"], unk_token: "<unk>" },
  }));
  writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ bos_token: "<s>", eos_token: "</s>", chat_template: "{% for m in messages %}<s>{{ m.content }}</s>{% endfor %}" }));
  return dir;
}

describe("segmenting keeps the first-section context", () => {
  const dir = firstSectionSensitiveTokenizer();
  const cached = createPreprocessor({ tokenizerDir: dir });
  const uncached = createPreprocessor({ tokenizerDir: dir, cache: false });

  test("a text prompt gets the post-processor's bos, and later sections get no ▁", () => {
    expect([...cached.encodeCompletion("ab</s>ab")]).toEqual([1, 6, 5, 2, 7]);
  });

  test("cached equals uncached on random text around added tokens", () => {
    const text = fc.array(fc.constantFrom("a", "b", " ", "<s>", "</s>", "ab"), { maxLength: 10 }).map((x) => x.join(""));
    fc.assert(fc.property(text, (t) => {
      expect([...cached.encodeCompletion(t)]).toEqual([...uncached.encodeCompletion(t)]);
    }), { numRuns: 300 });
  });
});
