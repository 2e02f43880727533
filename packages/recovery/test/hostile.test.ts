import { afterEach, describe, expect, test } from "bun:test";
import { Registry } from "prom-client";
import { hostileDumpPeer, LOOPBACK } from "@kv-epp/testkit";
import { PeerSet, dumpHandler, DumpParser, dumpStream, fetchDump, type DumpStaging, type RecoveryState, recoveryAttemptMetrics, runRecovery } from "../src/index.ts";
import { capturingLogger, ManualDiscovery, MapIndex, peer, quietLogger, readAll, sampleIndex, scripted, startPeer } from "./helpers.ts";

// Peers that decide the size and the pace of what this replica receives: bounded by the staging budget,
// the rate floor, the set-aside rule and the readiness deadline, never by the peer's good will.

const HOST = `${LOOPBACK}.3.2`;
const stops: (() => void)[] = [];
afterEach(() => {
  for (const s of stops.splice(0)) s();
});

function hostile(d: Parameters<typeof hostileDumpPeer>[0]) {
  const p = hostileDumpPeer(d, { hostname: HOST });
  stops.push(p.stop);
  return { ...p, peer: peer(p.url) };
}

/** A MapIndex staging that serves only `models` and reports twice the bytes of the runs it staged (~32 per block). */
class BoundedIndex extends MapIndex {
  staged = 0;
  constructor(readonly served: Set<string>) {
    super();
  }
  override begin(): DumpStaging {
    const inner = super.begin();
    this.staged = 0;
    return {
      ...inner,
      events: (key, worker, run) => {
        this.staged += run.byteLength * 2;
        inner.events(key, worker, run);
      },
      accepts: (key) => this.served.has(key),
      stagedBytes: () => this.staged,
    };
  }
}

describe("bounded memory", () => {
  test("an endless valid dump fails its attempt at the staging budget, and the staging is aborted", async () => {
    const p = hostile({ kind: "endless-events", model: "m:default", blockSize: 16 });
    const target = new BoundedIndex(new Set(["m:default"]));
    const err = await fetchDump({ peer: p.peer, target, timeoutMs: 5000, budgetBytes: 1 << 20 }).catch((e) => e);
    expect(err).toMatchObject({ name: "DumpFetchError", reason: "budget" });
    expect(err.message).toContain(`recovery budget of ${1 << 20} bytes`);
    expect(target.staged).toBeGreaterThan(1 << 20);
    expect(target.staged).toBeLessThan(4 << 20); // checked per chunk: a chunk's worth past the budget at most
    expect([target.commits, target.aborts, target.eventCount]).toEqual([0, 1, 0]);
  });

  test("models this replica does not serve are skipped without reaching the staging", async () => {
    const src = sampleIndex();
    const other = sampleIndex(1, 2, 3).snapshot()[0]!;
    src.models_.set("other/model:default", { blockSize: 32, events: other.events });
    const p = startPeer(dumpHandler({ source: src, ready: () => true, logger: quietLogger() }));
    stops.push(p.stop);
    const target = new BoundedIndex(new Set(["Qwen/Qwen3-0.6B:default"]));
    const r = await fetchDump({ peer: p.peer, target, timeoutMs: 5000 });
    expect(r).toMatchObject({ events: 6, skippedModels: 1 });
    expect(target.snapshot()).toEqual(sampleIndex().snapshot());
  });

  test("an endless stream of model keys costs no staging and no remembered keys: it ends at the byte limit", async () => {
    const p = hostile({ kind: "endless-models", blockSize: 16 });
    const target = new BoundedIndex(new Set(["served:default"]));
    const err = await fetchDump({ peer: p.peer, target, timeoutMs: 5000, limits: { maxBytes: 8 << 20 }, budgetBytes: 1 << 20 }).catch((e) => e);
    expect(err).toMatchObject({ reason: "budget" });
    expect(err.message).toContain("larger than the limit");
    expect(target.staged).toBe(0);
  });

  test("a parser skipping models keeps its duplicate check for the models it accepts", () => {
    const enc = new TextEncoder();
    const body = (s: string) => {
      const parser = new DumpParser(() => {}, {}, undefined, undefined, { acceptModel: (k) => k === "a" });
      parser.push(enc.encode(s));
      parser.end();
      return parser.skippedModels;
    };
    expect(body('{"x":{"block_size":1,"events":[]},"x":{"anything":[1,{"y":null}]},"a":{"block_size":1,"events":[]}}')).toBe(2);
    expect(() => body('{"a":{"block_size":1,"events":[]},"a":{"block_size":1,"events":[]}}')).toThrow(/appears twice/);
  });

  test("shutdown mid-staging of an endless dump ends the attempt at once", async () => {
    const p = hostile({ kind: "endless-events", model: "m:default", blockSize: 16 });
    const target = new BoundedIndex(new Set(["m:default"]));
    const abort = new AbortController();
    const attempt = fetchDump({ peer: p.peer, target, timeoutMs: 5000, signal: abort.signal }).catch((e) => e);
    while (target.staged < 1 << 20) await Bun.sleep(5);
    abort.abort(new Error("shutting down"));
    expect(((await attempt) as Error).message).toBe("shutting down");
    expect(target.aborts).toBe(1);
  });
});

describe("readiness cannot be held hostage", () => {
  test("a trickling body fails its attempt on the rate floor, well before any progress timeout", async () => {
    const p = hostile({ kind: "trickle", intervalMs: 50 });
    const err = await fetchDump({ peer: p.peer, target: new MapIndex(), timeoutMs: 60_000, minRate: { bytesPerSec: 1000, windowMs: 300 } }).catch((e) => e);
    expect(err).toMatchObject({ reason: "trickle" });
    expect(err.message).toContain("below the minimum rate");
  });

  test("a slow dump above the rate floor is not cut by it", async () => {
    const whole = await readAll(dumpStream(sampleIndex()));
    const pieces = 40;
    const size = Math.ceil(whole.length / pieces);
    // ~40 pieces 15 ms apart: several windows of 100 ms, each well above 500 B/s.
    const p = startPeer(() => {
      let i = 0;
      return new Response(
        new ReadableStream({
          async pull(c) {
            await Bun.sleep(15);
            if (i * size >= whole.length) return c.close();
            c.enqueue(whole.slice(i * size, ++i * size));
          },
        }),
      );
    });
    stops.push(p.stop);
    const target = new MapIndex();
    expect(await fetchDump({ peer: p.peer, target, timeoutMs: 5000, minRate: { bytesPerSec: 500, windowMs: 100 } })).toMatchObject({ events: 6 });
    expect(target.snapshot()).toEqual(sampleIndex().snapshot());
  });

  test("a peer that says serving and serves broken dumps is set aside: an empty bootstrap instead of waiting forever", async () => {
    const p = hostile({ kind: "broken" });
    const { logger, lines } = capturingLogger();
    const registry = new Registry();
    const metrics = recoveryAttemptMetrics(registry);
    const states: RecoveryState[] = [];
    const out = await runRecovery({
      discovery: new ManualDiscovery([p.peer]),
      target: new MapIndex(),
      timeoutMs: 2000,
      logger,
      backoff: { initialMs: 5 },
      maxPeerFailures: 3,
      onState: (s) => (states.push(s), metrics.observe(s)),
    });
    expect(out).toEqual({ kind: "empty_bootstrap", reason: "peers_failing" });
    expect(p.requests()).toBe(3);
    const failed = states.filter((s) => s.kind === "attempt_failed");
    expect(failed.map((s) => [s.reason, s.failures, s.setAside])).toEqual([["malformed", 1, false], ["malformed", 2, false], ["malformed", 3, true]]);
    expect(lines.some((l) => l.level === 40 && l.msg.startsWith("peer set aside") && l.peer === p.peer.id && l.reason === "malformed")).toBe(true);
    expect(lines.some((l) => l.level === 40 && l.msg.includes("EMPTY KV index") && l.reason === "peers_failing")).toBe(true);
    const text = await registry.metrics();
    expect(text).toContain('dynamo_epp_kv_recovery_attempt_failures_total{reason="malformed"} 3');
    expect(text).toContain(`dynamo_epp_kv_recovery_failing_peers{peer="${p.peer.id}",reason="malformed"} 1`);
  });

  test("a broken peer does not starve a good one that fails for a while", async () => {
    const bad = hostile({ kind: "broken" });
    let answers = 0;
    const flaky = startPeer((req) => (++answers <= 2 ? new Response("busy", { status: 500 }) : dumpHandler({ source: sampleIndex(), ready: () => true, logger: quietLogger() })(req)));
    stops.push(flaky.stop);
    const out = await runRecovery({
      discovery: new ManualDiscovery([bad.peer, flaky.peer]),
      target: new MapIndex(),
      timeoutMs: 2000,
      logger: quietLogger(),
      backoff: { initialMs: 5 },
      random: scripted([0.1, 0.9, 0.1, 0.9, 0.1, 0.9]), // the broken peer first in every cycle
    });
    expect(out).toMatchObject({ kind: "recovered", peer: flaky.peer.id, events: 6 });
    expect(bad.requests()).toBe(3); // set aside after its third failure, the good peer still tried
  });

  test("the readiness deadline ends recovery from a peer that never finishes: loud empty bootstrap", async () => {
    const p = hostile({ kind: "trickle", intervalMs: 20 });
    const { logger, lines } = capturingLogger();
    const out = await runRecovery({
      discovery: new ManualDiscovery([p.peer]),
      target: new MapIndex(),
      timeoutMs: 60_000,
      logger,
      minRate: { bytesPerSec: 0, windowMs: 0 }, // the floor off: only the deadline can end this
      deadlineMs: 300,
    });
    expect(out).toEqual({ kind: "empty_bootstrap", reason: "deadline" });
    expect(lines.some((l) => l.level === 40 && l.msg === "the recovery deadline of 300 ms passed: starting with an EMPTY KV index (empty bootstrap)")).toBe(true);
  });

  test("the deadline also ends a discovery that never starts", async () => {
    const d = new ManualDiscovery([]);
    d.start = () => new Promise(() => {});
    expect(await runRecovery({ discovery: d, target: new MapIndex(), timeoutMs: 1000, logger: quietLogger(), deadlineMs: 100 })).toEqual({ kind: "empty_bootstrap", reason: "deadline" });
  });
});

describe("PeerSet set-aside", () => {
  const A = peer("http://a:1");
  const B = peer("http://b:1");
  test("a peer failing maxFailures times in a row is no longer pending nor usable; leaving and returning resets it", () => {
    const s = new PeerSet(scripted([0.1, 0.9]), 2);
    s.update([A, B]);
    for (let cycle = 1; cycle <= 2; cycle++) {
      s.newCycle();
      expect(s.next()).toEqual(A);
      expect(s.fail()).toEqual({ peer: A, failures: cycle, setAside: cycle === 2 });
      expect(s.next()).toEqual(B);
      s.fail();
    }
    expect(s.usableCount).toBe(0);
    s.newCycle();
    expect(s.pendingIds()).toEqual([]);
    s.update([B]);
    s.update([A, B]);
    expect(s.setAsideIds()).toEqual([B.id]);
    expect(s.usableCount).toBe(1);
    s.newCycle();
    expect(s.pendingIds()).toEqual([A.id]);
  });

  test("a failure that would repeat as is (over budget) sets the peer aside at once", () => {
    const s = new PeerSet(scripted([0.1]), 3);
    s.update([A]);
    s.newCycle();
    s.next();
    expect(s.fail(true)).toEqual({ peer: A, failures: 1, setAside: true });
    expect(s.usableCount).toBe(0);
    const never = new PeerSet(scripted([0.1]), 0);
    never.update([A]);
    never.newCycle();
    never.next();
    expect(never.fail(true)).toEqual({ peer: A, failures: 1, setAside: false });
  });
});
