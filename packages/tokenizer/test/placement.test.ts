import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { freshWords } from "@kv-epp/testkit";
import { createPreprocessor, type ChatMessage, type PoolStats } from "../src/index";
import { jobChars, jobWork, Placement } from "../src/pool/placement";
import { ROUTING_TEXT_CHARS } from "../src/request/routing-job";
import { freshChat, QWEN3_DIR as dir, qwen3Pools } from "./qwen3-pool";

describe("placement policy", () => {
  // A reference model of the policy's promise: each job goes to a member that finishes it first, counting
  // the member's backlog and the job's cost there (cheap where its conversation is cached, all fresh elsewhere).
  const op = fc.record({
    key: fc.integer({ min: 0, max: 5 }),
    chars: fc.integer({ min: 0, max: 200_000 }),
    backlogs: fc.array(fc.integer({ min: 0, max: 300_000 }), { minLength: 4, maxLength: 4 }),
    move: fc.boolean(),
  });

  test("a job goes to a member that finishes it first, preferring the one holding its conversation", () => {
    fc.assert(fc.property(fc.integer({ min: 1, max: 4 }), fc.array(op, { maxLength: 40 }), (size, ops) => {
      const placement = new Placement(size);
      const held = new Map<number, { member: number; chars: number }>();
      for (const { key, chars, backlogs: all, move } of ops) {
        const backlogs = all.slice(0, size);
        const placed = placement.place(key, chars, backlogs, move);
        const home = held.get(key);
        const costOn = (i: number) => (i === home?.member ? ownCost(chars, home.chars) : chars);
        expect(placed.member).toBeGreaterThanOrEqual(0);
        expect(placed.member).toBeLessThan(size);
        if (home === undefined) {
          expect(placed.kind).toBe("new");
          expect(placed.cost).toBe(chars);
          if (!move) expect(placed.member).toBe(key % size);
          else expect(backlogs[placed.member]).toBe(Math.min(...backlogs));
        } else {
          expect(placed.kind).toBe(placed.member === home.member ? "affine" : "moved");
          expect(placed.cost).toBe(costOn(placed.member));
          if (!move) expect(placed.member).toBe(home.member);
          else {
            // Never a member that would finish later than another; the conversation's own member on a tie.
            const finish = backlogs[placed.member]! + placed.cost;
            for (let i = 0; i < size; i++) expect(finish).toBeLessThanOrEqual(backlogs[i]! + costOn(i));
            if (placed.kind === "moved") expect(finish).toBeLessThan(backlogs[home.member]! + costOn(home.member));
          }
        }
        held.set(key, { member: placed.member, chars });
      }
    }));
  });

  test("a growing conversation stays on its member while that member is busy with cached work", () => {
    // Ten sessions of 60k characters and more growing by 2-8k-character turns, on 2 members: the other idle,
    // the session's own busy with up to 3 cached turns like it. No turn leaves its member (a short conversation
    // may: tokenizing it whole elsewhere can be as cheap as waiting).
    fc.assert(fc.property(fc.array(fc.integer({ min: 2_000, max: 8_000 }), { minLength: 20, maxLength: 60 }), fc.integer({ min: 0, max: 3 }), (growth, busyTurns) => {
      const placement = new Placement(2);
      const sessions = Array.from({ length: 10 }, (_, k) => ({ key: 1000 + k, chars: 60_000, member: -1 }));
      for (const g of growth) {
        for (const s of sessions) {
          s.chars += g;
          // The other member idle, this one busy with `busyTurns` cached turns of this size.
          const busy = busyTurns * (g + s.chars * 0.1);
          const backlogs = [0, 0];
          if (s.member >= 0) backlogs[s.member] = busy;
          const placed = placement.place(s.key, s.chars, backlogs);
          if (s.member >= 0) expect(placed).toMatchObject({ member: s.member, kind: "affine" });
          s.member = placed.member;
        }
      }
    }));
  });

  test("conversations are remembered up to the bound, the least recently placed forgotten first", () => {
    const placement = new Placement(3, 4);
    for (let key = 0; key < 6; key++) placement.place(key, 100, [0, 0, 0]);
    expect(placement.remembered).toBe(4);
    // 0 and 1 were forgotten: placed as new (their hash's member on an idle pool), 5 is still known.
    expect(placement.place(0, 100, [0, 0, 0]).kind).toBe("new");
    expect(placement.place(5, 100, [0, 0, 0]).kind).toBe("affine");
  });

  test("a replaced member's conversations are forgotten: their next turns are placed as new, the others' stay", () => {
    const placement = new Placement(2);
    placement.place(0, 100, [0, 0]); // key 0's hash member: 0
    placement.place(1, 100, [0, 0]); // key 1's: 1
    placement.forget(0);
    expect(placement.remembered).toBe(1);
    expect(placement.place(0, 100, [0, 0]).kind).toBe("new");
    expect(placement.place(1, 100, [0, 0]).kind).toBe("affine");
  });

  test("a job's size is its message texts, or its prompt", () => {
    expect(jobChars({ kind: "prompt", text: "abcd" })).toBe(4);
    expect(jobChars({ kind: "chat", messages: [{ role: "user", content: "abc" }, { role: "user", content: [{ type: "text", text: "de" }, { type: "image_url" }] }, { role: "assistant", content: null }], opts: {} })).toBe(5);
  });

  // A body's bytes counted as fresh text made a 500 KB chat look ~4x its work, and a 32 MiB body due seconds after
  // it came (queue-order.ts), passed meanwhile by everything.
  test("a body's work is the text it can route (its bytes, at most 3 a routed character) and its reading, which every member pays", () => {
    const body = (bytes: number) => ({ kind: "body" as const, request: { body: new Uint8Array(bytes) } });
    expect(jobWork(body(1000))).toEqual({ chars: 1000, read: 70 });
    const big = jobWork(body(32 << 20));
    expect(big.chars).toBe(3 * ROUTING_TEXT_CHARS);
    expect(big.chars + big.read).toBeLessThan(0.1 * (32 << 20));
    // A CJK conversation (3 bytes a character) growing past 128 KiB still routes more text each turn: counted fresh.
    const placement0 = new Placement(1);
    placement0.place(7, jobWork(body(200_000)).chars, [0]);
    expect(placement0.place(7, jobWork(body(260_000)).chars, [0]).cost).toBeGreaterThanOrEqual(60_000);
    expect(jobWork({ kind: "prompt", text: "abcd" })).toEqual({ chars: 4, read: 0 });
    const placement = new Placement(2);
    expect(placement.place(1, 1000, [0, 0], true, 70).cost).toBe(1070);
    // Affine: its reading too, whatever it has cached; moved only when the tokenizing alone is cheaper elsewhere.
    expect(placement.place(1, 1100, [0, 0], true, 77)).toEqual({ member: 1 % 2, cost: 100 + 100 + 77, kind: "affine" });
    expect(placement.place(1, 1100, [0, 5000], true, 77)).toEqual({ member: 0, cost: 1100 + 77, kind: "moved" });
  });
});

function ownCost(chars: number, before: number): number {
  const fresh = Math.max(0, chars - before);
  return fresh + (chars - fresh) * 0.1;
}

describe("pool placement", () => {
  const pools = qwen3Pools();
  const jobsOf = (s: PoolStats) => s.members.map((m) => m.jobs);

  test("a later turn goes to the member that cached the earlier ones even while it is busy; a new conversation goes to the idle one", async () => {
    const { pool, registry } = await pools.startWithMetrics({ size: 2, budgetMs: 60_000 });
    // A long conversation (a 20k-word system prompt) growing by short turns, sent as far as a user message (Qwen3
    // renders a final assistant turn differently from an earlier one).
    const conv = freshChat(100, 7, 300, 20_000);
    const sends = [4, 6, 8, 4].map((n) => conv.slice(0, n));
    const other = freshChat(200, 1, 300);
    await pool.tokenize({ kind: "chat", messages: sends[0]!, opts: {} });
    const home = jobsOf(pool.stats()).indexOf(1);
    // Three later sends at once: the first keeps the home member busy while the others are placed; then a new
    // conversation.
    const later = sends.slice(1).map((messages) => pool.tokenize({ kind: "chat", messages, opts: {} }));
    const stranger = pool.tokenize({ kind: "chat", messages: other, opts: {} });
    await Promise.all([...later, stranger]);
    const stats = pool.stats();
    expect(stats.members[home]!.jobs).toBe(4);
    expect(stats.members[1 - home]!.jobs).toBe(1);
    expect(stats.placement).toMatchObject({ affine: 3, moved: 0, new: 2, remembered: 2 });
    const metrics = await registry.metrics();
    for (const kind of ["affine", "new"] as const) {
      expect(metrics).toContain(`dynamo_epp_tokenizer_pool_placements_total{placement="${kind}"} ${stats.placement[kind]}`);
    }
    // Nothing tokenized twice: each member's fresh tokens are those of one cache that saw its jobs alone.
    const fresh = (jobs: ChatMessage[][]) => {
      const pre = createPreprocessor({ tokenizerDir: dir });
      for (const messages of jobs) pre.encodeChat(messages);
      return pre.cacheStats().freshTokens;
    };
    expect(stats.members[home]!.freshTokens).toBe(fresh(sends));
    expect(stats.members[1 - home]!.freshTokens).toBe(fresh([other]));
  }, 120_000);

  test("a turn leaves its busy member when waiting there costs more than tokenizing it all fresh elsewhere", async () => {
    const pool = await pools.start({ size: 2, budgetMs: 60_000 });
    const conv = freshChat(300, 2, 200);
    await pool.tokenize({ kind: "chat", messages: conv, opts: {} });
    const home = jobsOf(pool.stats()).indexOf(1);
    // A huge fresh turn of the same conversation occupies its member; a short retry of the first turn is
    // cheaper tokenized whole on the idle member than queued behind it.
    const huge = pool.tokenize({ kind: "chat", messages: [...conv, { role: "assistant", content: freshWords(300_000, 301) }], opts: {} });
    const retry = await pool.tokenize({ kind: "chat", messages: conv, opts: {} });
    expect(retry.complete).toBe(true);
    expect(pool.stats().placement).toMatchObject({ affine: 1, moved: 1, new: 1 });
    expect(pool.stats().members[1 - home]!.jobs).toBe(1);
    await huge;
  }, 120_000);
});
