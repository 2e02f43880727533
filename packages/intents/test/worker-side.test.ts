import { describe, expect, test } from "bun:test";
import {
  advertiseHost,
  HostLookupError,
  IntentValidationError,
  MemoryDiscoveryStore,
  registerWorkerIntents,
  replaceHost,
  workerDescriptors,
  type RegisterWorkerIntentsOptions,
} from "../src/index.ts";
import { HOST, recordingSleep } from "./fixtures.ts";

const base = (discovery: RegisterWorkerIntentsOptions["discovery"]): RegisterWorkerIntentsOptions => ({
  discovery,
  workerId: "mock-a",
  controlTarget: HOST,
  model: "m",
  blockSize: 16,
  topic: "",
  ranks: [
    { rank: 0, kvEvents: "tcp://127.0.0.1:5557", replay: "tcp://127.0.0.1:5600" },
    { rank: 1, kvEvents: "tcp://127.0.0.1:5558", replay: null },
  ],
  address: "127.0.0.1:8000",
  metricsUrl: "http://127.0.0.1:8000/metrics",
});

describe("registerWorkerIntents: what a worker calls at start", () => {
  test("advertises the pod address in place of the loopback a wildcard bind reports", () => {
    const [r0, r1] = workerDescriptors({ ...base(new MemoryDiscoveryStore().connect()), advertiseHost: "10.1.2.3" });
    expect([r0!.endpoint, r0!.replayEndpoint, r0!.address, r1!.endpoint, r1!.replayEndpoint]).toEqual([
      "tcp://10.1.2.3:5557",
      "tcp://10.1.2.3:5600",
      "10.1.2.3:8000",
      "tcp://10.1.2.3:5558",
      undefined,
    ]);
    expect(r0!.indexerDomain).toBe("m:default");
    // The metrics URL too: a wildcard bind must not tell the host to scrape its own loopback.
    expect([r0!.metricsUrl, r1!.metricsUrl]).toEqual(["http://10.1.2.3:8000/metrics", "http://10.1.2.3:8000/metrics"]);
    expect(workerDescriptors({ ...base(new MemoryDiscoveryStore().connect()), advertiseHost: "fd00::7" })[0]!.metricsUrl).toBe("http://[fd00::7]:8000/metrics");
    expect(workerDescriptors(base(new MemoryDiscoveryStore().connect()))[0]!.metricsUrl).toBe("http://127.0.0.1:8000/metrics");
    expect(replaceHost("tcp://[::1]:5557", "fd00::7")).toBe("tcp://[fd00::7]:5557");
    expect(replaceHost("127.0.0.1:8000", "fd00::7")).toBe("[fd00::7]:8000");
  });

  test("without retry, a missing host is the caller's error", async () => {
    const store = new MemoryDiscoveryStore();
    await expect(registerWorkerIntents(base(store.connect()))).rejects.toThrow(HostLookupError);
  });

  test("with retry, waits (backing off) until the host is advertised, then registers every rank", async () => {
    const store = new MemoryDiscoveryStore();
    const { sleep, delays } = recordingSleep((n) => {
      if (n === 3) void advertiseHost({ discovery: store.connect(), hostInstance: HOST });
    });
    const owner = await registerWorkerIntents({ ...base(store.connect()), retry: true, sleep });
    expect(delays).toEqual([1000, 2000, 4000]);
    expect(owner.managedRanks()).toEqual([0, 1]);
    expect(store.snapshot("intent").length).toBe(2);
  });

  test("with retry, an invalid descriptor still fails at once, and an abort ends the waiting", async () => {
    const store = new MemoryDiscoveryStore();
    await expect(registerWorkerIntents({ ...base(store.connect()), blockSize: 0, retry: true })).rejects.toThrow(IntentValidationError);
    const caller = new AbortController();
    const { sleep, delays } = recordingSleep((n) => n === 2 && caller.abort());
    await expect(registerWorkerIntents({ ...base(store.connect()), retry: true, sleep, signal: caller.signal })).rejects.toThrow(HostLookupError);
    expect(delays).toEqual([1000, 2000]);
  });
});
