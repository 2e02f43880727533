// mergeWorkerSets: pod discovery (or the static list) and intents into one worker set, per mode.
import { describe, expect, test } from "bun:test";
import { hostOf, intentWorkers, mergeWorkerSets, type AttachmentIntent } from "../src/index.ts";
import type { WorkerSpec } from "@kv-epp/protocol";
import { descriptor, HOST } from "./fixtures.ts";
import { LOOPBACK } from "@kv-epp/testkit";
import { servedRanks } from "../src/workers.ts";

/** A worker as the EPP's pod discovery lists it (Ready pods only): port convention, dpSize 1. */
const pod = (id: string, ip: string) => ({ id, address: `${ip}:8000`, kvEvents: `tcp://${ip}:5557`, dpSize: 1, metricsUrl: `http://${ip}:8000/metrics` });

/** One intent of `workerId` for rank r, published on `ip`, stating `address` when given. */
function intent(workerId: string, dpRank: number, ip: string, over: Partial<AttachmentIntent> = {}): AttachmentIntent {
  return {
    ...descriptor(dpRank, { workerId, endpoint: `tcp://${ip}:${7000 + dpRank}`, replayEndpoint: undefined, topic: "kv", blockSize: 32 }),
    intentId: 1 + dpRank,
    host: HOST,
    producer: `${workerId}-proc`,
    registeredAt: 1,
    ...over,
  };
}
const rank = (dpRank: number, ip: string) => ({ dpRank, kvEvents: `tcp://${ip}:${7000 + dpRank}`, topic: "kv", blockSize: 32 });

describe("kubernetes mode: pod discovery decides membership", () => {
  test("an intent whose worker has no Ready pod does not make it routable; a listed pod takes its intents' ranks", () => {
    const intents = intentWorkers([
      intent("w-ready", 0, "10.0.0.1"),
      intent("w-ready", 1, "10.0.0.1"),
      intent("w-crashed", 0, "10.0.0.2", { address: "10.0.0.2:8000" }),
      intent("w-nameless", 0, "10.0.0.3"),
    ]);
    const { workers, unroutable, aliases } = mergeWorkerSets([pod("w-ready", "10.0.0.1"), pod("w-plain", "10.0.0.9")], intents, { mode: "kubernetes" });
    expect(workers).toEqual([
      { ...pod("w-ready", "10.0.0.1"), kvEvents: "tcp://10.0.0.1:7000", replay: undefined, dpSize: 2, ranks: [rank(0, "10.0.0.1"), rank(1, "10.0.0.1")] },
      pod("w-plain", "10.0.0.9"),
    ]);
    expect(unroutable).toEqual([
      { id: "w-crashed", reason: "no-ready-pod", address: "10.0.0.2:8000" },
      { id: "w-nameless", reason: "no-ready-pod" },
    ]);
    expect(aliases).toEqual([]);
    // The same intents without pod discovery: the one stating an address is a worker of its own.
    expect(mergeWorkerSets([pod("w-ready", "10.0.0.1")], intents).workers.map((w) => w.id)).toEqual(["w-ready", "w-crashed"]);
  });

  test("a worker registered under another id merges into its pod, by address or by pod IP: one worker, one listener per endpoint", () => {
    const byAddress = intent("10.0.0.1:8000", 0, "10.0.0.1", { address: "10.0.0.1:8000" });
    const byEndpointIp = intent("mock-b", 0, "10.0.0.2");
    const byAddressIp = intent("mock-c", 0, "10.0.0.3", { address: "10.0.0.3:9000" });
    const pods = [pod("vllm-a", "10.0.0.1"), pod("vllm-b", "10.0.0.2"), pod("vllm-c", "10.0.0.3")];
    const { workers, unroutable, aliases } = mergeWorkerSets(pods, intentWorkers([byAddress, byEndpointIp, byAddressIp]), { mode: "kubernetes" });
    expect(workers.map((w) => [w.id, w.address, w.dpSize, "ranks" in w ? w.ranks : undefined])).toEqual([
      ["vllm-a", "10.0.0.1:8000", 1, [rank(0, "10.0.0.1")]],
      ["vllm-b", "10.0.0.2:8000", 1, [rank(0, "10.0.0.2")]],
      ["vllm-c", "10.0.0.3:8000", 1, [rank(0, "10.0.0.3")]],
    ]);
    expect(unroutable).toEqual([]);
    expect(aliases).toEqual([
      { intentWorker: "10.0.0.1:8000", worker: "vllm-a" },
      { intentWorker: "mock-b", worker: "vllm-b" },
      { intentWorker: "mock-c", worker: "vllm-c" },
    ]);
    const endpoints = workers.flatMap((w) => ("ranks" in w ? w.ranks.map((r) => r.kvEvents) : [w.kvEvents]));
    expect(new Set(endpoints).size).toBe(endpoints.length);
  });

  test("a rank no intent states yet keeps its pod-discovery source: a worker's per-rank intents arriving one by one never close a listed rank", () => {
    // Two target ports: pod discovery lists ranks 0 and 1 on the KV port + r; the worker registers one Lease per rank.
    const twoRanks = { ...pod("w", "10.0.0.1"), dpSize: 2 };
    const guessed = (r: number) => ({ dpRank: r, kvEvents: `tcp://10.0.0.1:${5557 + r}`, replay: undefined });
    const ranksWith = (intents: AttachmentIntent[]) => {
      const [w] = mergeWorkerSets([twoRanks], intentWorkers(intents), { mode: "kubernetes" }).workers;
      return "ranks" in w! ? w.ranks : undefined;
    };
    expect(ranksWith([intent("w", 0, "10.0.0.1")])).toEqual([rank(0, "10.0.0.1"), guessed(1)]);
    expect(ranksWith([intent("w", 1, "10.0.0.1")])).toEqual([guessed(0), rank(1, "10.0.0.1")]);
    expect(ranksWith([intent("w", 0, "10.0.0.1"), intent("w", 1, "10.0.0.1")])).toEqual([rank(0, "10.0.0.1"), rank(1, "10.0.0.1")]);
    // A rank pod discovery does not list (the worker runs more ranks than the EPP's --dp-size says) still comes from its intent.
    expect(ranksWith([intent("w", 0, "10.0.0.1"), intent("w", 1, "10.0.0.1"), intent("w", 2, "10.0.0.1")])!.map((r) => r.dpRank)).toEqual([0, 1, 2]);
  });

  test("the intent of the pod's own id wins a rank both state; a shared IP (hostNetwork) is no match", () => {
    const own = intent("vllm-a", 0, "10.0.0.1", { endpoint: "tcp://10.0.0.1:7777" });
    const other = [intent("alias-a", 0, "10.0.0.1"), intent("alias-a", 1, "10.0.0.1")];
    const { workers } = mergeWorkerSets([pod("vllm-a", "10.0.0.1")], intentWorkers([...other, own]), { mode: "kubernetes" });
    expect(workers.map((w) => ("ranks" in w ? w.ranks.map((r) => r.kvEvents) : []))).toEqual([["tcp://10.0.0.1:7777", "tcp://10.0.0.1:7001"]]);
    const shared = mergeWorkerSets([pod("n1-a", "10.0.0.5"), { ...pod("n1-b", "10.0.0.5"), address: "10.0.0.5:8001" }], intentWorkers([intent("x", 0, "10.0.0.5")]), {
      mode: "kubernetes",
    });
    expect(shared.workers.every((w) => !("ranks" in w))).toBe(true);
    expect(shared.unroutable).toEqual([{ id: "x", reason: "no-ready-pod" }]);
  });
});

describe("ranks behind a pod's inactive ports", () => {
  test("servedRanks leaves out the ranks the listing marks inactive, whatever intents state", () => {
    const ranks = [0, 1, 2].map((r) => rank(r, "10.0.0.1"));
    expect(servedRanks(pod("w", "10.0.0.1"), ranks)).toEqual(ranks);
    expect(servedRanks({ ...pod("w", "10.0.0.1"), inactiveRanks: [1] }, ranks)).toEqual([rank(0, "10.0.0.1"), rank(2, "10.0.0.1")]);
    expect(servedRanks({ ...pod("w", "10.0.0.1"), inactiveRanks: [0, 1, 2] }, ranks)).toEqual([]);
  });

  test("an intent worker whose every rank is behind an inactive port leaves the pod as listed and is no alias of it", () => {
    // The pod serves rank 0 (rank 1's port is not active); another id's intent states rank 1 only, on the pod's IP.
    const listed = { ...pod("vllm-a", "10.0.0.1"), inactiveRanks: [1] };
    const { workers, aliases } = mergeWorkerSets([listed], intentWorkers([intent("alias-a", 1, "10.0.0.1")]), { mode: "kubernetes" });
    expect(workers).toEqual([listed]);
    expect(aliases).toEqual([]);
    // Once it states an active rank too, it contributes, and is reported.
    const both = mergeWorkerSets([listed], intentWorkers([intent("alias-a", 0, "10.0.0.1"), intent("alias-a", 1, "10.0.0.1")]), { mode: "kubernetes" });
    expect(both.workers.map((w) => ("ranks" in w ? w.ranks : []))).toEqual([[rank(0, "10.0.0.1")]]);
    expect(both.aliases).toEqual([{ intentWorker: "alias-a", worker: "vllm-a" }]);
  });
});

describe("static mode (the default): the list and the intents together", () => {
  test("an intent under another id with a listed worker's address merges into it; two intent ids on one address are one worker", () => {
    const listed = { ...pod("static-a", `${LOOPBACK}.7.20`), address: `${LOOPBACK}.7.20:8000` };
    const intents = intentWorkers([
      intent(`${LOOPBACK}.7.20:8000`, 0, `${LOOPBACK}.7.20`, { address: `${LOOPBACK}.7.20:8000` }),
      intent("w-new", 0, `${LOOPBACK}.7.21`, { address: `${LOOPBACK}.7.21:8000` }),
      intent("w-new-again", 1, `${LOOPBACK}.7.21`, { address: `${LOOPBACK}.7.21:8000`, metricsUrl: `http://${LOOPBACK}.7.21:9100/metrics` }),
      // Same IP, another port: another worker on the same machine, not an alias.
      intent("w-other-port", 0, `${LOOPBACK}.7.20`, { address: `${LOOPBACK}.7.20:8001`, endpoint: `tcp://${LOOPBACK}.7.20:7100` }),
    ]);
    const { workers, unroutable, aliases } = mergeWorkerSets([listed], intents);
    expect(workers.map((w) => [w.id, w.address, w.metricsUrl, "ranks" in w ? w.ranks.map((r) => r.kvEvents) : []])).toEqual([
      ["static-a", `${LOOPBACK}.7.20:8000`, `http://${LOOPBACK}.7.20:8000/metrics`, [`tcp://${LOOPBACK}.7.20:7000`]],
      ["w-new", `${LOOPBACK}.7.21:8000`, `http://${LOOPBACK}.7.21:9100/metrics`, [`tcp://${LOOPBACK}.7.21:7000`, `tcp://${LOOPBACK}.7.21:7001`]],
      ["w-other-port", `${LOOPBACK}.7.20:8001`, `http://${LOOPBACK}.7.20:8001/metrics`, [`tcp://${LOOPBACK}.7.20:7100`]],
    ]);
    expect(unroutable).toEqual([]);
    expect(aliases).toEqual([
      { intentWorker: `${LOOPBACK}.7.20:8000`, worker: "static-a" },
      { intentWorker: "w-new-again", worker: "w-new" },
    ]);
  });

  test("hostOf reads the host of every endpoint form", () => {
    expect(["10.0.0.1:8000", "tcp://10.0.0.1:5557", "[fd00::1]:8000", "tcp://[fd00::1]:5557", "http://h.example:80/metrics", "plain"].map(hostOf)).toEqual([
      "10.0.0.1",
      "10.0.0.1",
      "fd00::1",
      "fd00::1",
      "h.example",
      "plain",
    ]);
  });
});

describe("DP load-balancing mode", () => {
  test("a worker whose intents state hybrid LB serves its ranks from one API server that numbers them from 0; internal or none keeps global numbering", () => {
    const node = (dpLb?: "internal" | "hybrid" | "external") =>
      intentWorkers([2, 3].map((r) => intent("node-b", r, "10.0.0.2", { address: "10.0.0.2:8000", ...(dpLb ? { dpLb } : {}) })));
    const [hybrid] = mergeWorkerSets([], node("hybrid")).workers;
    expect(hybrid!.servers).toEqual([{ address: "10.0.0.2:8000", ranks: [2, 3] }]);
    const [onPod] = mergeWorkerSets<WorkerSpec>([pod("node-b", "10.0.0.2")], node("hybrid"), { mode: "kubernetes" }).workers;
    expect(onPod!.servers).toEqual([{ address: "10.0.0.2:8000", ranks: [2, 3] }]);
    expect(mergeWorkerSets([], node("internal")).workers[0]!.servers).toBeUndefined();
    expect(mergeWorkerSets([], node()).workers[0]!.servers).toBeUndefined();
  });
});

describe("disaggregation role", () => {
  test("an intent-only worker takes the role its intents state; a listed worker's own role (its pod label) wins over its intents'", () => {
    const prefill = intentWorkers([0, 1].map((r) => intent("p-0", r, "10.0.0.4", { address: "10.0.0.4:8000", role: "prefill" })));
    expect(mergeWorkerSets([], prefill).workers[0]!.role).toBe("prefill");
    const labelled = { ...pod("p-0", "10.0.0.4"), role: "decode" as const };
    expect(mergeWorkerSets<WorkerSpec>([labelled], prefill, { mode: "kubernetes" }).workers[0]!.role).toBe("decode");
    expect(mergeWorkerSets<WorkerSpec>([pod("p-0", "10.0.0.4")], prefill, { mode: "kubernetes" }).workers[0]!.role).toBe("prefill");
    expect(mergeWorkerSets([], intentWorkers([intent("w", 0, "10.0.0.5", { address: "10.0.0.5:8000" })])).workers[0]!.role).toBeUndefined();
  });
});
