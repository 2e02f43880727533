import { describe, expect, test } from "bun:test";
import {
  desiredAttachments,
  intentRecordName,
  IntentRegistrationError,
  registerIntents,
  WITHDRAW_BACKOFF,
  type RegisterIntentsOptions,
} from "../src/index.ts";
import { descriptor, HOST, recordingSleep, withHost, WORKER } from "./fixtures.ts";
import { LOOPBACK } from "@kv-epp/testkit";

const ranks3 = [descriptor(0), descriptor(1), descriptor(2)];
/** Ids are drawn 100, 101, ... in rank order (see opts). */
const nameOf = (id: number) => intentRecordName({ workerId: WORKER, dpRank: id - 100, intentId: id });

function opts(h: Awaited<ReturnType<typeof withHost>>, over: Partial<RegisterIntentsOptions> = {}): RegisterIntentsOptions {
  let next = 100;
  return { discovery: h.worker, workerId: WORKER, controlTarget: HOST, descriptors: ranks3, newId: () => next++, ...over };
}

describe("registration is a transaction in rank order", () => {
  test("registers one intent per rank, in rank order, and lists the managed ranks", async () => {
    const h = await withHost();
    const owner = await registerIntents(opts(h, { descriptors: [descriptor(2), descriptor(0), descriptor(1)] }));
    expect(owner.managedRanks()).toEqual([0, 1, 2]);
    expect(h.worker.calls).toEqual([100, 101, 102].map((id) => `register ${nameOf(id)}`));
    expect(h.intents().length).toBe(3);
  });

  for (const k of [1, 2, 3]) {
    test(`the failure of registration ${k} of 3 rolls back every intent, the failed one too`, async () => {
      const h = await withHost();
      h.worker.failRegistration(k);
      const err = await registerIntents(opts(h)).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(IntentRegistrationError);
      expect((err as IntentRegistrationError).dpRank).toBe(k - 1);
      expect(h.intents()).toEqual([]);
      // Withdrawn newest first, starting with the one that failed (it half-landed).
      const names = [100, 101, 102].slice(0, k).map(nameOf);
      expect(h.worker.calls.filter((c) => c.startsWith("unregister"))).toEqual(names.reverse().map((n) => `unregister ${n}`));
    });
  }

  test("an abandoned transaction rolls back every intent, including the one still in flight", async () => {
    const h = await withHost();
    const pause = h.worker.pauseRegistration(2);
    const caller = new AbortController();
    const pending = registerIntents(opts(h, { signal: caller.signal }));
    await pause.reached;
    expect(h.intents().length).toBe(1);
    caller.abort(new Error("caller went away"));
    const err = await pending.catch((e: unknown) => e);
    expect(String(err)).toContain("caller went away");
    expect(h.intents()).toEqual([]);
    // The paused request lands after the rollback: it is withdrawn as well, and rank 3 never starts.
    pause.release();
    for (let i = 0; i < 20 && h.worker.calls.filter((c) => c.startsWith("unregister")).length < 3; i++) await Bun.sleep(1);
    expect(h.intents()).toEqual([]);
    expect(h.worker.calls.filter((c) => c.startsWith("register"))).toEqual([`register ${nameOf(100)}`, `register ${nameOf(101)}`]);
  });

  test("a caller that has already gone away registers nothing", async () => {
    const h = await withHost();
    const caller = new AbortController();
    caller.abort();
    await expect(registerIntents(opts(h, { signal: caller.signal }))).rejects.toThrow();
    expect(h.worker.calls).toEqual([]);
  });

  test("the materialized intent preserves producer instance, worker, rank, endpoint, topic and multimodal token ids", async () => {
    const h = await withHost();
    const d = descriptor(1, { topic: "raw-topic", multimodalTokenIds: [7, 151655], endpoint: `tcp://${LOOPBACK}.7.9:6001` });
    await registerIntents(opts(h, { descriptors: [d], now: () => 1234 }));
    const [got] = desiredAttachments(await h.hostSide.list({ kind: "intent" }), HOST);
    expect(got).toBeDefined();
    expect(got!.producer).toBe("worker-a-proc");
    expect(got!.workerId).toBe(WORKER);
    expect(got!.dpRank).toBe(1);
    expect(got!.endpoint).toBe(`tcp://${LOOPBACK}.7.9:6001`);
    expect(got!.replayEndpoint).toBe(d.replayEndpoint!);
    expect(got!.topic).toBe("raw-topic");
    expect(got!.multimodalTokenIds).toEqual([7, 151655]);
    expect(got).toEqual({ ...d, intentId: 100, host: HOST, producer: "worker-a-proc", registeredAt: 1234 });
  });
});

describe("close withdraws every intent", () => {
  test("in reverse order, and a second close does nothing more", async () => {
    const h = await withHost();
    const owner = await registerIntents(opts(h));
    const first = owner.close();
    expect(owner.close()).toBe(first);
    await first;
    await owner.close();
    expect(h.intents()).toEqual([]);
    expect(h.worker.calls.filter((c) => c.startsWith("unregister"))).toEqual([102, 101, 100].map((id) => `unregister ${nameOf(id)}`));
  });

  test("retries through transient failures with backoff from 100 ms doubling to 5 s", async () => {
    const h = await withHost();
    const { sleep, delays } = recordingSleep();
    const owner = await registerIntents(opts(h, { descriptors: [descriptor(0)], sleep }));
    h.worker.failUnregisters(9);
    await owner.close();
    expect(h.intents()).toEqual([]);
    expect(delays).toEqual([100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    expect(WITHDRAW_BACKOFF).toEqual({ initialMs: 100, maxMs: 5000 });
  });

  test("the backoff starts again at 100 ms for the next intent", async () => {
    const h = await withHost();
    const { sleep, delays } = recordingSleep();
    const owner = await registerIntents(opts(h, { descriptors: [descriptor(0), descriptor(1)], sleep }));
    h.worker.failUnregisters(3);
    await owner.close();
    expect(delays).toEqual([100, 200, 400]);
    h.worker.failUnregisters(0);
    expect(h.intents()).toEqual([]);
  });

  test("stops retrying when the lease ends", async () => {
    const h = await withHost();
    const { sleep, delays } = recordingSleep((n) => n === 5 && h.worker.endLease());
    const owner = await registerIntents(opts(h, { descriptors: [descriptor(0), descriptor(1)], sleep }));
    h.worker.failUnregisters(Number.POSITIVE_INFINITY);
    await owner.close();
    expect(delays).toEqual([100, 200, 400, 800, 1600]);
    // Five failed attempts on the first intent, none on the second: the lease took both.
    expect(h.worker.calls.filter((c) => c.startsWith("unregister")).length).toBe(5);
  });

  test("an intent already missing counts as withdrawn", async () => {
    const h = await withHost();
    const { sleep, delays } = recordingSleep();
    const owner = await registerIntents(opts(h, { descriptors: [descriptor(0), descriptor(1)], sleep }));
    await h.worker.unregister({ kind: "intent", name: nameOf(101), producer: "worker-a-proc" });
    await owner.close();
    expect(delays).toEqual([]);
    expect(h.intents()).toEqual([]);
  });
});
