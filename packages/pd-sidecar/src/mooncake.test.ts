import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { LOOPBACK } from "@kv-epp/testkit";
import { BootstrapError, chooseRank, ENGINE_MAP_TTL_MS, EngineMapCache, engineMap } from "./mooncake.ts";

// The engine-map cache against a real bootstrap server on loopback: one query per prefill worker until it expires or
// a request through it fails; a failed query is not kept.

const H = `${LOOPBACK}.2.148`;
let server: ReturnType<typeof Bun.serve>;
let queries = 0;
let answer: () => Response = () => Response.json({ "0": { engine_id: "e0" }, "1": { engine_id: "e1" } });
beforeAll(() => {
  server = Bun.serve({ hostname: H, port: 0, fetch: () => (queries++, answer()) });
});
afterAll(() => void server.stop(true));
const addr = () => `http://${H}:${server.port}`;

describe("EngineMapCache", () => {
  test("asked once while fresh (concurrent lookups share the query), again once expired or forgotten", async () => {
    let now = 0;
    const cache = new EngineMapCache(() => now);
    queries = 0;
    const [a, b] = await Promise.all([cache.get("p:1", addr()), cache.get("p:1", addr())]);
    expect(queries).toBe(1);
    expect([...a]).toEqual([["0", "e0"], ["1", "e1"]]);
    expect(b).toBe(a);
    now = ENGINE_MAP_TTL_MS - 1;
    await cache.get("p:1", addr());
    expect(queries).toBe(1);
    now = ENGINE_MAP_TTL_MS;
    await cache.get("p:1", addr());
    expect(queries).toBe(2);
    cache.forget("p:1");
    await cache.get("p:1", addr());
    expect(queries).toBe(3);
    // Another prefill worker has its own entry.
    await cache.get("p:2", addr());
    expect(queries).toBe(4);
  });

  test("forgetting an older lookup keeps a newer one", async () => {
    const cache = new EngineMapCache(() => 0);
    queries = 0;
    const old = cache.get("p:1", addr());
    await old;
    cache.forget("p:1");
    const fresh = cache.get("p:1", addr());
    cache.forget("p:1", old);
    expect(cache.get("p:1", addr())).toBe(fresh);
    await fresh;
    expect(queries).toBe(2);
  });

  test("a rank the map lacks asks it again once, not for every request; true the first time for each rank", async () => {
    const cache = new EngineMapCache(() => 0);
    queries = 0;
    const first = cache.get("p:1", addr());
    await first;
    expect(cache.missingRank("p:1", addr(), first, "7")).toBe(true);
    const second = cache.get("p:1", addr());
    expect(second).not.toBe(first);
    await second;
    expect(queries).toBe(2);
    // The second answer lacks it too: not asked a third time, nor logged again; another rank is logged once.
    expect(cache.missingRank("p:1", addr(), second, "7")).toBe(false);
    expect(cache.missingRank("p:1", addr(), first, "7")).toBe(false);
    expect(cache.missingRank("p:1", addr(), second, "8")).toBe(true);
    expect(cache.get("p:1", addr())).toBe(second);
    expect(queries).toBe(2);
  });

  test("a failed query is not kept, and says why", async () => {
    const cache = new EngineMapCache(() => 0);
    queries = 0;
    answer = () => new Response("no", { status: 503 });
    const failed = await cache.get("p:1", addr()).catch((e) => e);
    expect(failed).toBeInstanceOf(BootstrapError);
    expect(failed.reason).toBe("bootstrap_answer");
    answer = () => Response.json({ "0": { engine_id: "e0" } });
    expect([...(await cache.get("p:1", addr()))]).toEqual([["0", "e0"]]);
    expect(queries).toBe(2);
    const down = await new EngineMapCache().get("p:9", `http://${LOOPBACK}.2.149:9`).catch((e) => e);
    expect(down.reason).toBe("bootstrap_unreachable");
  });
});

describe("engineMap and chooseRank", () => {
  test("entries without a string engine_id are skipped; none at all is an error", () => {
    expect([...engineMap({ "0": { engine_id: "a" }, "1": { worker_addr: {} }, "2": "x" })]).toEqual([["0", "a"]]);
    expect(() => engineMap({ "0": {} })).toThrow("engine_id not found");
    expect(() => engineMap([])).toThrow("not a JSON object");
  });

  test("the named rank's engine, else one drawn uniformly; a named rank the map lacks is drawn over, as a fallback", () => {
    const map = new Map([["0", "a"], ["1", "b"]]);
    expect(chooseRank(map, "1")).toEqual({ rank: "1", engineId: "b", fallback: false });
    expect(chooseRank(map, "2", () => 0.99)).toEqual({ rank: "1", engineId: "b", fallback: true });
    expect(chooseRank(map, undefined, () => 0)).toEqual({ rank: "0", engineId: "a", fallback: false });
    expect(chooseRank(map, undefined, () => 0.99)).toEqual({ rank: "1", engineId: "b", fallback: false });
  });
});
