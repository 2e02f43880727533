import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { freshWords } from "@kv-epp/testkit";
import { dueAt, nextDue, type Queued } from "../src/pool/queue-order";
import { qwen3Pools } from "./qwen3-pool";

describe("queue order: earliest due first", () => {
  const pools = qwen3Pools();
  const job = fc.record({ submitted: fc.integer({ min: 0, max: 1000 }), cost: fc.integer({ min: 0, max: 5_000_000 }) });

  test("takes the earliest due, the earliest queued on a tie", () => {
    fc.assert(fc.property(fc.array(job, { maxLength: 30 }), (queue) => {
      const i = nextDue(queue);
      if (queue.length === 0) return expect(i).toBe(-1);
      const best = Math.min(...queue.map(dueAt));
      expect(dueAt(queue[i]!)).toBe(best);
      expect(queue.slice(0, i).every((q) => dueAt(q) > best)).toBe(true);
    }));
  });

  // One member serving arrivals one at a time, as the pool's pump does: a request is passed only by requests
  // due no later than it, so never by one that came after its own due instant (no starvation by later arrivals).
  test("a request is passed only by requests due before it, never by one that came after its due instant", () => {
    fc.assert(fc.property(fc.array(job, { minLength: 1, maxLength: 40 }), fc.integer({ min: 1, max: 50 }), (jobs, msPerRequest) => {
      const arrivals = jobs.map((j, id) => ({ ...j, id })).sort((a, b) => a.submitted - b.submitted);
      const started = new Map<number, number>();
      const queue: (Queued & { id: number })[] = [];
      let now = 0;
      let next = 0;
      while (started.size < arrivals.length) {
        while (next < arrivals.length && arrivals[next]!.submitted <= now) queue.push(arrivals[next++]!);
        if (queue.length === 0) {
          now = arrivals[next]!.submitted;
          continue;
        }
        const [taken] = queue.splice(nextDue(queue), 1);
        started.set(taken!.id, now);
        now += msPerRequest + taken!.cost / 100_000;
      }
      for (const a of arrivals) {
        for (const b of arrivals) {
          const passed = b.submitted > a.submitted && started.get(b.id)! < started.get(a.id)!;
          if (passed) expect(b.submitted).toBeLessThanOrEqual(dueAt(a));
        }
      }
    }));
  });

  test("in the pool: a short pick queued behind a long fresh text on the same member is tokenized first", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 60_000 });
    const order: string[] = [];
    const done = (name: string) => () => order.push(name);
    // The member is busy with the first; the second long text and then the short pick queue behind it.
    const running = pool.tokenize({ kind: "prompt", text: freshWords(200_000, 71) }).then(done("running"));
    const long = pool.tokenize({ kind: "prompt", text: freshWords(200_000, 72) }).then(done("long"));
    const short = pool.tokenize({ kind: "prompt", text: "a short question" }).then(done("short"));
    await Promise.all([running, long, short]);
    expect(order).toEqual(["running", "short", "long"]);
  }, 120_000);
});
