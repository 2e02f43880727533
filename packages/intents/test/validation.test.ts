import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import {
  advertiseHost,
  decodeIntent,
  encodeIntent,
  workerDescriptors,
  RecordDecodeError,
  encodeHost,
  findHost,
  HOST_PROTOCOL_VERSION,
  HostLookupError,
  IntentValidationError,
  maskIntentId,
  MemoryDiscoveryStore,
  newIntentId,
  registerIntents,
  validateDescriptors,
  type IntentDescriptor,
  type ValidationCode,
} from "../src/index.ts";
import { capturingLogger, descriptor, DOMAIN, HOST, withHost, WORKER } from "./fixtures.ts";

describe("validation: each failure is its own clear error", () => {
  const cases: [string, IntentDescriptor[], ValidationCode, RegExp][] = [
    ["no descriptor", [], "no-descriptors", /at least one/],
    ["a DP rank twice", [descriptor(0), descriptor(1), descriptor(1)], "duplicate-rank", /rank 1 appears more than once/],
    [
      "a cache-owner id twice in one rank",
      [descriptor(0, { cacheOwners: [{ id: "gpu", indexerDomain: DOMAIN }, { id: "gpu", indexerDomain: DOMAIN }] })],
      "duplicate-cache-owner",
      /"gpu" appears more than once/,
    ],
    ["block size 0", [descriptor(0, { blockSize: 0 })], "block-size", /block size must be a positive integer, got 0/],
    ["a negative block size", [descriptor(0, { blockSize: -16 })], "block-size", /got -16/],
    [
      "a cache owner of another indexer domain",
      [descriptor(0, { cacheOwners: [{ id: "cpu", indexerDomain: "other:default" }] })],
      "indexer-domain-mismatch",
      /"other:default", the intent has/,
    ],
    ["another protocol", [descriptor(0, { protocol: "sglang-kv" })], "unsupported-protocol", /"sglang-kv" is not supported/],
    ["an empty endpoint", [descriptor(0, { endpoint: "" })], "bad-endpoint", /is not tcp:\/\/host:port/],
    ["an endpoint without tcp://", [descriptor(0, { endpoint: "10.0.0.5:5557" })], "bad-endpoint", /"10.0.0.5:5557" is not tcp/],
    ["another worker's id", [descriptor(0), descriptor(1, { workerId: "worker-b" })], "worker-mismatch", /differs from this process's worker id "worker-a"/],
  ];
  for (const [what, descriptors, code, message] of cases) {
    test(`rejects ${what}`, () => {
      let err: unknown;
      try {
        validateDescriptors(descriptors, WORKER);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(IntentValidationError);
      expect((err as IntentValidationError).code).toBe(code);
      expect((err as Error).message).toMatch(message);
    });
  }

  test("the same cache-owner id on two ranks is fine", () => {
    expect(() => validateDescriptors([descriptor(0), descriptor(1)], WORKER)).not.toThrow();
  });

  test("an invalid descriptor set registers nothing", async () => {
    const h = await withHost();
    await expect(registerIntents({ discovery: h.worker, workerId: WORKER, controlTarget: HOST, descriptors: [descriptor(0, { blockSize: 0 })] })).rejects.toThrow(
      IntentValidationError,
    );
    expect(h.worker.calls).toEqual([]);
  });
});

describe("intent records from the store", () => {
  const record = (over: Record<string, unknown>) =>
    encodeIntent({ intentId: 1, host: HOST, producer: "p", registeredAt: 1, ...descriptor(0), ...over } as never);

  test("a record whose endpoints are not dialable is undecodable (skipped by readers), not handed to the EPP", () => {
    expect(() => decodeIntent(record({}))).not.toThrow();
    for (const bad of [{ endpoint: "10.0.0.5:5557" }, { endpoint: "tcp://10.0.0.5:70000" }, { replayEndpoint: "udp://x:1" }, { address: "10.0.0.5" }, { metricsUrl: "not a url" }])
      expect(() => decodeIntent(record(bad))).toThrow(RecordDecodeError);
  });
});

describe("the DP load-balancing mode in a record", () => {
  const record = (over: Record<string, unknown>) =>
    encodeIntent({ intentId: 1, host: HOST, producer: "p", registeredAt: 1, ...descriptor(0), ...over } as never);

  test("a worker's dpLb is carried; one that is not a vLLM mode makes the record undecodable", () => {
    expect(decodeIntent(record({ dpLb: "hybrid" })).dpLb).toBe("hybrid");
    expect(decodeIntent(record({})).dpLb).toBeUndefined();
    expect(() => decodeIntent(record({ dpLb: "round-robin" }))).toThrow(RecordDecodeError);
    expect(workerDescriptors({ workerId: "w", model: "m", blockSize: 16, topic: "", ranks: [{ rank: 2, kvEvents: "tcp://10.0.0.2:5559" }], dpLb: "hybrid" })[0]!.dpLb).toBe("hybrid");
  });

  test("a worker's disaggregation role is carried; one that is not prefill, decode or both makes the record undecodable", () => {
    expect(decodeIntent(record({ role: "prefill" })).role).toBe("prefill");
    expect(decodeIntent(record({})).role).toBeUndefined();
    expect(() => decodeIntent(record({ role: "prefill-decode" }))).toThrow(RecordDecodeError);
    expect(workerDescriptors({ workerId: "w", model: "m", blockSize: 16, topic: "", ranks: [{ rank: 0, kvEvents: "tcp://10.0.0.2:5557" }], role: "decode" })[0]!.role).toBe("decode");
  });
});

describe("host lookup", () => {
  const ad = (hostInstance: string, version = HOST_PROTOCOL_VERSION) => encodeHost({ version, hostInstance, producer: `p-${hostInstance}` });
  async function storeWith(payloads: unknown[]) {
    const store = new MemoryDiscoveryStore();
    const d = store.connect();
    let i = 0;
    for (const payload of payloads) await d.register({ kind: "host", name: `kv-host-${i++}`, payload });
    return store.connect({ producer: "worker" });
  }
  const lookup = async (payloads: unknown[]) => {
    const { log, lines } = capturingLogger();
    const result = await findHost(await storeWith(payloads), HOST, log).catch((e: unknown) => e);
    return { result, warnings: lines.filter((l) => l.level === 40) };
  };

  test("finds the one live host of the current version whose instance is the control target", async () => {
    const { result } = await lookup([ad("other-epp"), ad(HOST), ad(HOST, HOST_PROTOCOL_VERSION + 1)]);
    expect(result).toEqual({ version: HOST_PROTOCOL_VERSION, hostInstance: HOST, producer: `p-${HOST}` });
  });

  test("no host is an error naming the count", async () => {
    const { result } = await lookup([ad("other-epp"), ad(HOST, 0)]);
    expect(result).toBeInstanceOf(HostLookupError);
    expect((result as HostLookupError).count).toBe(0);
    expect(String(result)).toContain("found 0");
  });

  test("several hosts is an error naming the count", async () => {
    const { result } = await lookup([ad(HOST), ad(HOST), ad("other-epp")]);
    expect((result as HostLookupError).count).toBe(2);
    expect(String(result)).toContain("found 2");
  });

  test("undecodable advertisements are skipped with a warning", async () => {
    const { result, warnings } = await lookup([{ v: "one" }, "garbage", ad(HOST), null]);
    expect((result as { hostInstance: string }).hostInstance).toBe(HOST);
    expect(warnings.length).toBe(3);
    expect(warnings.every((w) => w.msg === "skipping undecodable host advertisement")).toBe(true);
  });

  test("registration fails before writing anything when the host is missing", async () => {
    const h = await withHost();
    await expect(registerIntents({ discovery: h.worker, workerId: WORKER, controlTarget: "no-such-host", descriptors: [descriptor(0)] })).rejects.toThrow(
      HostLookupError,
    );
    expect(h.worker.calls).toEqual([]);
  });

  test("replicas advertising one host share one record, so a worker finds exactly one", async () => {
    const h = await withHost();
    const second = await advertiseHost({ discovery: h.store.connect({ producer: "epp-1" }), hostInstance: HOST });
    expect((await findHost(h.worker, HOST, capturingLogger().log)).hostInstance).toBe(HOST);
    await h.hostSide.close(); // replica 0 dies: the advertisement stays with replica 1
    expect((await findHost(h.worker, HOST, capturingLogger().log)).hostInstance).toBe(HOST);
    await second.close();
    await expect(findHost(h.worker, HOST, capturingLogger().log)).rejects.toThrow("found 0");
  });
});

describe("intent ids", () => {
  const reference = (bytes: Uint8Array) => Number(new DataView(bytes.buffer).getBigUint64(0) & ((1n << 53n) - 1n));

  test("masking keeps the low 53 bits: a JSON-safe integer", () => {
    fc.assert(
      fc.property(fc.uint8Array({ minLength: 8, maxLength: 8 }), (bytes) => {
        const id = maskIntentId(bytes);
        expect(Number.isSafeInteger(id)).toBe(true);
        expect(id).toBeGreaterThanOrEqual(0);
        expect(id).toBe(reference(bytes));
        expect(JSON.parse(JSON.stringify(id))).toBe(id);
      }),
      { numRuns: 2000 },
    );
  });

  test("a new id is never 0: a zero draw is drawn again", () => {
    fc.assert(
      fc.property(fc.array(fc.uint8Array({ minLength: 8, maxLength: 8 }), { minLength: 1, maxLength: 4 }), (draws) => {
        const zero = new Uint8Array([0xff, 0xe0, 0, 0, 0, 0, 0, 0]); // only masked-off bits set
        const seq = [zero, new Uint8Array(8), ...draws, new Uint8Array([0, 0, 0, 0, 0, 0, 0, 1])];
        let i = 0;
        const id = newIntentId((buf) => {
          buf.set(seq[i++]!);
          return buf;
        });
        expect(id).not.toBe(0);
        expect(Number.isSafeInteger(id)).toBe(true);
        expect(i).toBeGreaterThanOrEqual(3);
      }),
    );
  });

  test("ids from the cryptographic source are distinct, non-zero, 53-bit", () => {
    const ids = new Set(Array.from({ length: 1000 }, () => newIntentId()));
    expect(ids.size).toBe(1000);
    for (const id of ids) expect(id > 0 && id <= Number.MAX_SAFE_INTEGER).toBe(true);
  });
});
