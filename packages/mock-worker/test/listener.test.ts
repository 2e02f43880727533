import { afterEach, expect, test } from "bun:test";
import { KvEventListener, type ListenerSignal } from "@kv-epp/kv-events";
import { startMockWorker } from "../src/index.ts";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { post } from "./support.ts";

const cleanup: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

test("the fault switches drive the EPP's KvEventListener through its consumer rules", async () => {
  const w = await startMockWorker({
    listen: `${LOOPBACK}.2.8`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.8:0`, replay: `tcp://${LOOPBACK}.2.8:0`, speed: 0, blockSize: 4, logLevel: "silent",
  });
  cleanup.push(() => w.close());
  const listener = new KvEventListener({ workerId: "mock", dpRank: 0, endpoint: w.ranks[0]!.kvEvents, replayEndpoint: w.ranks[0]!.replay! });
  cleanup.push(() => listener.close());
  const signals: ListenerSignal[] = [];
  listener.attach((s) => signals.push(s));
  listener.start();
  const admin = (body: object) => post(`${w.url}/admin/faults`, body);
  const complete = (from: number) => post(`${w.url}/v1/completions`, { prompt: [from, from + 1, from + 2, from + 3], max_tokens: 1 });
  const resets = () => signals.filter((s) => s.kind === "reset").map((s) => (s as { reason: string }).reason);
  // Keeps changing the cache until the listener has seen something (the subscription is up).
  const untilReceived = (what: string) => {
    const n = signals.length;
    let i = 0;
    return waitFor(async () => {
      await complete(10_000 + i++ * 10);
      return signals.length > n;
    }, { message: what });
  };

  await untilReceived("the listener's baseline");
  expect(resets()).toEqual([]);

  // Paused changes use no seq: the stream stays contiguous, no reset.
  await admin({ action: "pause" });
  await complete(1);
  await admin({ action: "resume" });
  await complete(2);
  await waitFor(() => signals.some((s) => s.kind === "batch" && s.batch.events.some((e) => e.type === "BlockStored" && e.tokenIds[0] === 2)), { message: "the store after resume" });
  expect(resets()).toEqual([]);

  // Skipped seqs are a gap the replay buffer cannot fill.
  await admin({ action: "skip", count: 1000 });
  await complete(3);
  await waitFor(() => resets().includes("gap-unrecovered"), { message: "a gap-unrecovered reset" });

  // A restart sends seq back to 0.
  await admin({ action: "restart" });
  await untilReceived("a batch after the restart");
  await waitFor(() => resets().includes("restarted"), { message: "a restarted reset" });
  expect(listener.counters.restarts).toBe(1);
});
