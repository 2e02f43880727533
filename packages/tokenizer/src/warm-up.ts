// Warming a preprocessor before it serves. A thread's first requests run through code the JIT has not compiled
// yet and through lazily built state: measured in a fresh pool member, its first chat (~7k fresh tokens) took
// ~95 ms and the next two 14 and 8 ms, against ~3 ms once warm, so a replica that reported Ready cold answered
// its first picks past the tokenization budget. Warming runs the whole request path (a body's JSON read, the
// chat template, the segmenter and its cache, the BPE) on invented text, then forgets what it cached.
import { encodeJob } from "./job";
import { readBody } from "./request/read-body";
import type { ChatMessage, Preprocessor } from "./types";

export type WarmUp = { tokens: number; ms: number };

/** Turns of the warming conversation: each resends the earlier ones (cached) and adds new text (fresh). */
const TURNS = 12;
const WORDS_PER_TURN = 600;

/**
 * Runs a growing conversation of invented text through `pre` as chat bodies (and one completion), as a request
 * would, then empties its segment cache and zeroes the cache's counters: what the warm-up cached is not
 * traffic. The BPE's word cache keeps the warm-up's words (bounded, and overwritten by use).
 */
export function warmUp(pre: Preprocessor): WarmUp {
  const t0 = performance.now();
  const rand = seeded(0x3a7e);
  const enc = new TextEncoder();
  const messages: ChatMessage[] = [{ role: "system", content: mixedText(rand, WORDS_PER_TURN / 2) }];
  let tokens = 0;
  for (let turn = 0; turn < TURNS; turn++) {
    if (turn > 0) messages.push({ role: "assistant", content: mixedText(rand, WORDS_PER_TURN / 4) });
    messages.push({ role: "user", content: mixedText(rand, WORDS_PER_TURN) });
    const read = readBody({ body: enc.encode(JSON.stringify({ model: "warm-up", messages, max_tokens: 1 })), path: "/v1/chat/completions" }, pre.rules);
    if (!(read.job instanceof Uint32Array)) tokens += encodeJob(pre, read.job).length;
  }
  tokens += pre.encodeCompletion(mixedText(rand, WORDS_PER_TURN)).length;
  pre.resetCache();
  return { tokens, ms: performance.now() - t0 };
}

/**
 * Invented text of `words` words: prose of made-up words and common ones, numbers, code, CJK and other scripts,
 * emoji, punctuation and whitespace runs (every branch of a pre-tokenizer's scanner). `rand` in [0, 1).
 */
export function mixedText(rand: () => number, words: number): string {
  const syllables = ["ka", "lo", "mi", "ne", "ru", "sta", "tion", "pre", "fix", "qu", "ter", "blo", "ck", "zh", "ü", "é", "ø", "th", "ing", "ex"];
  const common = ["the", "a", "of", "to", "and", "in", "is", "that", "for", "it", "with", "as", "on", "be", "at", "by", "this", "The", "We"];
  const code = ["def f(x):\n    return x * 2\n", "if (a && b) {\n\tcall(a, b);\n}\n", "const y = arr.map((v) => v + 1);", "SELECT id FROM t WHERE k = 'v';"];
  const cjk = ["日本語の文章", "中文文本处理", "한국어 문장", "Привет мир", "مرحبا بالعالم", "😀🚀✨"];
  const out: string[] = [];
  for (let i = 0; i < words; i++) {
    const r = rand();
    if (r < 0.4) out.push(common[Math.floor(rand() * common.length)]!);
    else if (r < 0.46) out.push(String(Math.floor(rand() * 1e7)));
    else if (r < 0.49) out.push(code[Math.floor(rand() * code.length)]!);
    else if (r < 0.52) out.push(cjk[Math.floor(rand() * cjk.length)]!);
    else if (r < 0.55) out.push(rand() < 0.5 ? ".\n\n" : ",   ");
    else {
      let w = "";
      for (let k = 1 + Math.floor(rand() * 3); k > 0; k--) w += syllables[Math.floor(rand() * syllables.length)];
      out.push(rand() < 0.1 ? w[0]!.toUpperCase() + w.slice(1) : w);
    }
  }
  return out.join(" ");
}

/** A small seeded PRNG (an LCG) for invented text: in [0, 1). */
export function seeded(seed: number): () => number {
  return () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
}
