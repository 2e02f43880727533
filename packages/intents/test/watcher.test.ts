import { describe, expect, test } from "bun:test";
import {
  encodeIntent,
  intentWorkers,
  IntentWatcher,
  mergeWorkerSets,
  MemoryDiscoveryStore,
  registerIntents,
  registerWorkerIntents,
  type AttachmentIntent,
} from "../src/index.ts";
import { capturingLogger, descriptor, HOST, withHost, WORKER } from "./fixtures.ts";
import { LOOPBACK } from "@kv-epp/testkit";

/** Collects every desired set handed to onChange. */
function watch(discovery: ReturnType<MemoryDiscoveryStore["connect"]>, hostInstance = HOST) {
  const changes: AttachmentIntent[][] = [];
  const { log, lines } = capturingLogger();
  const w = new IntentWatcher({ discovery, hostInstance, onChange: (d) => changes.push(d), log });
  const settle = () => new Promise((r) => setTimeout(r, 0));
  return { w, changes, lines, settle, keys: () => w.desired().map((d) => `${d.workerId}/${d.dpRank}`) };
}

describe("IntentWatcher: live intents to a desired set, level-triggered", () => {
  test("the first snapshot goes out even when empty; then every change, and only changes", async () => {
    const h = await withHost();
    const v = watch(h.hostSide);
    await v.w.start();
    expect(v.changes).toEqual([[]]);
    const owner = await registerIntents({ discovery: h.worker, workerId: WORKER, controlTarget: HOST, descriptors: [descriptor(0), descriptor(1)] });
    await v.settle();
    expect(v.keys()).toEqual(["worker-a/0", "worker-a/1"]);
    const before = v.changes.length;
    // A snapshot whose desired set is the same (an intent for another host appeared) is not a change.
    const elsewhere = { ...descriptor(0, { workerId: "w-x" }), intentId: 3, host: "another-epp", producer: "x", registeredAt: 1 };
    // (registered under this host's name, so only the payload says it is for another host)
    await h.store.connect().register({ kind: "intent", name: "kv-intent-x", payload: encodeIntent(elsewhere), host: HOST });
    await v.settle();
    expect(v.changes.length).toBe(before);
    await owner.close();
    await v.settle();
    expect(v.changes.at(-1)).toEqual([]);
    v.w.close();
  });

  test("a worker process that dies without closing is detached when its lease ends", async () => {
    const h = await withHost();
    const v = watch(h.hostSide);
    await v.w.start();
    await registerIntents({ discovery: h.worker, workerId: WORKER, controlTarget: HOST, descriptors: [descriptor(0), descriptor(1)] });
    await v.settle();
    expect(v.keys().length).toBe(2);
    h.store.expire("worker-a-proc");
    await v.settle();
    expect(v.keys()).toEqual([]);
  });

  test("only intents addressed to this host, of the supported protocol; undecodable ones are skipped with one warning", async () => {
    const h = await withHost();
    const other = h.store.connect({ producer: "stranger" });
    const base = { ...descriptor(0), intentId: 9, host: HOST, producer: "stranger", registeredAt: 1 };
    await other.register({ kind: "intent", name: "kv-intent-a", payload: encodeIntent({ ...base, workerId: "w-other-host", host: "another-epp" }), host: HOST });
    await other.register({ kind: "intent", name: "kv-intent-a2", payload: encodeIntent({ ...base, workerId: "w-other-host2", host: "another-epp" }), host: "another-epp" });
    await other.register({ kind: "intent", name: "kv-intent-b", payload: encodeIntent({ ...base, workerId: "w-sglang", protocol: "sglang" }), host: HOST });
    await other.register({ kind: "intent", name: "kv-intent-c", payload: { v: 1, intentId: 0 }, host: HOST });
    await other.register({ kind: "intent", name: "kv-intent-d", payload: encodeIntent({ ...base, workerId: "w-ok" }), host: HOST });
    const v = watch(h.hostSide);
    await v.w.start();
    expect(v.keys()).toEqual(["w-ok/0"]);
    // Another snapshot does not warn again about the same records.
    await other.register({ kind: "intent", name: "kv-intent-e", payload: encodeIntent({ ...base, workerId: "w-ok2" }), host: HOST });
    await v.settle();
    expect(v.keys()).toEqual(["w-ok/0", "w-ok2/0"]);
    const warnings = v.lines.filter((l) => l.msg === "skipping intent");
    expect(warnings.map((w) => w.record).sort()).toEqual(["kv-intent-b", "kv-intent-c"]);
  });

  test("a restarted worker's newer intent supersedes the old one for the same rank", async () => {
    const h = await withHost();
    const old = h.store.connect({ producer: "old-proc" });
    const fresh = h.store.connect({ producer: "new-proc" });
    const base = { ...descriptor(0), host: HOST };
    await old.register({ kind: "intent", name: "kv-intent-old", payload: encodeIntent({ ...base, intentId: 5, producer: "old-proc", registeredAt: 10, endpoint: `tcp://${LOOPBACK}.7.1:1` }), host: HOST });
    await fresh.register({ kind: "intent", name: "kv-intent-new", payload: encodeIntent({ ...base, intentId: 4, producer: "new-proc", registeredAt: 20, endpoint: `tcp://${LOOPBACK}.7.1:2` }), host: HOST });
    const v = watch(h.hostSide);
    await v.w.start();
    expect(v.w.desired().map((d) => [d.producer, d.endpoint])).toEqual([["new-proc", `tcp://${LOOPBACK}.7.1:2`]]);
  });
});

describe("from attachments to the worker set", () => {
  const pod = (id: string) => ({ id, address: `${LOOPBACK}.7.${id.length}:8000`, kvEvents: "tcp://guess:5557", dpSize: 1, metricsUrl: "http://m/metrics" });

  test("a worker known to pod discovery keeps its address and takes its intents' per-rank endpoints", async () => {
    const h = await withHost();
    await registerWorkerIntents({
      discovery: h.worker,
      workerId: WORKER,
      controlTarget: HOST,
      model: "Qwen/Qwen3-0.6B",
      blockSize: 16,
      topic: "",
      ranks: [
        { rank: 0, kvEvents: `tcp://${LOOPBACK}.7.1:7000`, replay: null },
        { rank: 1, kvEvents: `tcp://${LOOPBACK}.7.1:7100`, replay: `tcp://${LOOPBACK}.7.1:7101` },
      ],
    });
    const v = watch(h.hostSide);
    await v.w.start();
    const { workers, unroutable } = mergeWorkerSets([pod(WORKER), pod("pod-only")], intentWorkers(v.w.desired()));
    expect(unroutable).toEqual([]);
    expect(workers).toEqual([
      {
        ...pod(WORKER),
        kvEvents: `tcp://${LOOPBACK}.7.1:7000`,
        replay: undefined,
        dpSize: 2,
        ranks: [
          { dpRank: 0, kvEvents: `tcp://${LOOPBACK}.7.1:7000`, topic: "", blockSize: 16 },
          { dpRank: 1, kvEvents: `tcp://${LOOPBACK}.7.1:7100`, replay: `tcp://${LOOPBACK}.7.1:7101`, topic: "", blockSize: 16 },
        ],
      },
      pod("pod-only"),
    ]);
  });

  test("an intent-only worker joins with its own address; without one it waits for its pod", () => {
    const a = (workerId: string, address?: string): AttachmentIntent => ({
      ...descriptor(0, { workerId, ...(address ? { address } : {}) }),
      intentId: 1,
      host: HOST,
      producer: "p",
      registeredAt: 1,
    });
    const { workers, unroutable } = mergeWorkerSets([], intentWorkers([a("static-w", `${LOOPBACK}.7.5:8000`), a("nameless")]));
    expect(workers.map((w) => [w.id, w.address, w.metricsUrl, w.dpSize])).toEqual([["static-w", `${LOOPBACK}.7.5:8000`, `http://${LOOPBACK}.7.5:8000/metrics`, 1]]);
    expect(unroutable).toEqual([{ id: "nameless", reason: "no-address" }]);
  });
});
