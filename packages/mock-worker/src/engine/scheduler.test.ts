import { expect, test } from "bun:test";
import fc from "fast-check";
import { DEFAULT_TIMING, idleTtftMs, StepScheduler, type TimingParams } from "./scheduler.ts";

const PARAMS: TimingParams = { speed: 1, stepBaseMs: 10, msPerToken: 1, maxNumBatchedTokens: 8, maxNumSeqs: 2 };

/** Runs a scheduler to the end; per request, the elapsed ms at its first and last token. */
function drain<T>(s: StepScheduler<T>) {
  let now = 0;
  const first = new Map<T, number>(), last = new Map<T, number>();
  for (let r = s.step(); r; r = s.step()) {
    now += r.ms;
    for (const i of r.first) first.set(i, now);
    for (const i of r.finished) last.set(i, now);
  }
  return { first, last, now };
}

test("a step costs its base plus its tokens; a prompt longer than the budget prefills in chunks", () => {
  const s = new StepScheduler<string>(PARAMS, () => 0);
  s.add("a", 20, 2);
  const steps = [s.step()!, s.step()!, s.step()!, s.step()!];
  // 8 + 8 + 4 prompt tokens, the last chunk samples the first token; then one decode token.
  expect(steps.map((r) => r.ms)).toEqual([18, 18, 14, 11]);
  expect(steps.map((r) => r.first)).toEqual([[], [], ["a"], []]);
  expect(steps[3]!.finished).toEqual(["a"]);
  expect(s.step()).toBeNull();
  expect(idleTtftMs(PARAMS, 20, 0)).toBe(18 + 18 + 14);
});

test("the cached prefix is read at admission and the last prompt token is always computed", () => {
  const looked: string[] = [];
  const s = new StepScheduler<string>(PARAMS, (i) => (looked.push(i), i === "hit" ? 16 : 0));
  s.add("hit", 16, 1);
  expect(looked).toEqual([]);
  const r = s.step()!;
  expect(looked).toEqual(["hit"]);
  expect(r.ms).toBe(11); // all 16 cached, one recomputed
  expect(r.finished).toEqual(["hit"]);
  expect(idleTtftMs(PARAMS, 16, 16)).toBe(11);
});

test("running requests are served before waiting ones, and at most maxNumSeqs run", () => {
  const s = new StepScheduler<string>(PARAMS, () => 0);
  s.add("a", 4, 3);
  s.add("b", 4, 3);
  s.add("c", 4, 1);
  const r1 = s.step()!;
  expect(r1.first).toEqual(["a", "b"]);
  expect(s.runningCount).toBe(2);
  expect(s.waitingCount).toBe(1);
  const r2 = s.step()!; // two decodes; c waits for a slot even though budget is left
  expect(r2.ms).toBe(12);
  expect(r2.next).toEqual(["a", "b"]);
  const r3 = s.step()!;
  expect(r3.finished).toEqual(["a", "b"]);
  const r4 = s.step()!;
  expect(r4.first).toEqual(["c"]);
});

test("prompts queued together share the budget: the second one's first token waits for the first's chunks", () => {
  const s = new StepScheduler<string>({ ...PARAMS, maxNumSeqs: 8 }, () => 0);
  s.add("a", 12, 1);
  s.add("b", 12, 1);
  const { first } = drain(s);
  // step 1: a 8, step 2: a 4 + b 4, step 3: b 8
  expect(first.get("a")).toBe(18 + 18);
  expect(first.get("b")).toBe(18 + 18 + 18);
});

test("a removed request leaves the waiting queue or the running set", () => {
  const s = new StepScheduler<string>(PARAMS, () => 0);
  s.add("a", 4, 5);
  s.add("b", 4, 5);
  s.add("c", 4, 5);
  s.step();
  expect(s.remove("a")).toBe(true);
  expect(s.remove("c")).toBe(true);
  expect(s.remove("c")).toBe(false);
  const { last } = drain(s);
  expect([...last.keys()]).toEqual(["b"]);
  expect(s.idle).toBe(true);
});

test("the forecast is the first token the scheduler really gives a request queued now", () => {
  fc.assert(
    fc.property(
      fc.array(fc.record({ prompt: fc.integer({ min: 1, max: 40 }), output: fc.integer({ min: 1, max: 6 }), cached: fc.integer({ min: 0, max: 40 }) }), { maxLength: 12 }),
      fc.integer({ min: 0, max: 6 }),
      fc.record({ prompt: fc.integer({ min: 1, max: 60 }), cached: fc.integer({ min: 0, max: 60 }) }),
      (queued, warm, probe) => {
        const cached = new Map<number, number>(queued.map((q, i) => [i, q.cached]));
        cached.set(-1, probe.cached);
        const s = new StepScheduler<number>({ ...PARAMS, maxNumSeqs: 3 }, (i) => cached.get(i)!);
        queued.forEach((q, i) => s.add(i, q.prompt, q.output));
        for (let i = 0; i < warm; i++) s.step();
        const forecast = s.forecastFirstTokenMs(probe.prompt, probe.cached, 3, (i) => cached.get(i)!);
        s.add(-1, probe.prompt, 3);
        expect(forecast).toBe(drain(s).first.get(-1)!);
        expect(forecast).toBeGreaterThanOrEqual(idleTtftMs(s.params, probe.prompt, probe.cached));
      },
    ),
  );
});

test("a forecast past its limit gives up", () => {
  const s = new StepScheduler<string>(PARAMS, () => 0);
  s.add("long", 1000, 1);
  expect(s.forecastFirstTokenMs(4, 0, 1, () => 0, 100)).toBe(Number.POSITIVE_INFINITY);
  expect(s.forecastFirstTokenMs(4, 0, 1, () => 0)).toBeGreaterThan(1000);
});

test("speed scales every step and speed 0 is instantaneous", () => {
  expect(idleTtftMs({ ...DEFAULT_TIMING, speed: 2 }, 100, 0)).toBe(2 * idleTtftMs(DEFAULT_TIMING, 100, 0));
  const s = new StepScheduler<string>({ ...DEFAULT_TIMING, speed: 0 }, () => 0);
  s.add("a", 10_000, 50);
  expect(drain(s).now).toBe(0);
});

/** KV slots of `capacity` blocks of 4 tokens, held per request (nothing cached): what vLLM's allocate_slots checks. */
function slots(capacity: number) {
  const held = new Map<string, number>();
  const calls: [string, number][] = [];
  const used = () => [...held.values()].reduce((a, b) => a + b, 0);
  return {
    held, calls,
    allocate(i: string, tokens: number) {
      calls.push([i, tokens]);
      const need = Math.ceil(tokens / 4) - (held.get(i) ?? 0);
      if (need > capacity - used()) return false;
      held.set(i, (held.get(i) ?? 0) + Math.max(0, need));
      return true;
    },
    release(i: string) {
      held.delete(i);
    },
  };
}

test("every scheduled step first allocates the tokens the request holds after it, prefill chunks and decodes alike", () => {
  const kv = slots(100);
  const s = new StepScheduler<string>(PARAMS, (i) => (i === "b" ? 4 : 0), kv);
  s.add("a", 20, 2);
  s.step();
  expect(kv.calls).toEqual([["a", 8]]);
  s.add("b", 6, 1);
  s.step();
  s.step(); // a's last 4 tokens, then b admitted with 4 cached and 2 left
  expect(kv.calls).toEqual([["a", 8], ["a", 16], ["a", 20], ["b", 6]]);
  drain(s);
  expect(kv.calls.at(-1)).toEqual(["a", 21]); // a's decode
  expect(s.preemptions).toBe(0);
});

test("a running request that cannot get its blocks preempts the newest running one, which recomputes from the head of the queue", () => {
  const kv = slots(6);
  const s = new StepScheduler<string>({ ...PARAMS, maxNumBatchedTokens: 16 }, () => 0, kv);
  s.add("old", 8, 12); // 2 blocks, then one per 4 generated tokens
  s.add("new", 8, 12);
  s.step(); // both prefill: 4 blocks
  for (let k = 0; k < 8; k++) s.step(); // decoding: both at 16 tokens, 4 blocks each... not both
  expect(s.preemptions).toBeGreaterThan(0);
  expect(kv.held.has("old")).toBe(true);
  const { last } = drain(s);
  expect([...last.keys()].sort()).toEqual(["new", "old"]); // the preempted one still finished
  expect(last.get("old")!).toBeLessThan(last.get("new")!);
});

test("a waiting request that does not fit stays at the head of the queue; one too big even alone runs without its slots", () => {
  const kv = slots(3);
  const s = new StepScheduler<string>(PARAMS, () => 0, kv);
  s.add("a", 12, 2); // 3 blocks, then a fourth for its second token: alone, it runs past its slots
  s.add("b", 8, 1); // 2 blocks: waits for a
  s.step();
  s.step();
  expect([s.runningCount, s.waitingCount]).toEqual([1, 1]);
  const { first, last } = drain(s);
  expect(first.get("b")!).toBeGreaterThan(last.get("a")!); // admitted once a's blocks were freed
  const big = new StepScheduler<string>(PARAMS, () => 0, slots(2));
  big.add("huge", 40, 1);
  expect(drain(big).last.has("huge")).toBe(true);
});
