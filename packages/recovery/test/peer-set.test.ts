import { describe, expect, test } from "bun:test";
import { Backoff } from "@kv-epp/protocol";
import { PeerSet, dumpHandler, type RecoveryState, runRecovery } from "../src/index.ts";
import { gate, ManualDiscovery, MapIndex, peer, quietLogger, sampleIndex, scripted, startPeer, until } from "./helpers.ts";

const A = peer("http://a:1");
const B = peer("http://b:1");
const C = peer("http://c:1");

describe("PeerSet", () => {
  test("peers are tried one at a time in the order of their attempt-scoped priorities", () => {
    const s = new PeerSet(scripted([0.7, 0.2, 0.5]));
    s.update([A, B, C]);
    s.newCycle();
    expect(s.pendingIds()).toEqual([B.id, C.id, A.id]);
    expect(s.next()).toEqual(B);
    expect(() => s.next()).toThrow(/already active/);
  });

  test("unchanged churn is not a change and does not disturb pending, tried or the active attempt", () => {
    const s = new PeerSet(scripted([0.1, 0.2, 0.3]));
    s.update([A, B, C]);
    s.newCycle();
    s.next();
    s.fail();
    const active = s.next();
    expect(s.update([C, B, A])).toBe(false);
    expect(s.update([B, C, A, B])).toBe(false);
    expect(s.active).toEqual(active);
    expect(s.pendingIds()).toEqual([C.id]);
    expect(s.triedIds()).toEqual([A.id]);
  });

  test("a peer that joins during a cycle is added to pending", () => {
    const s = new PeerSet(scripted([0.1, 0.2, 0.05]));
    s.update([A, B]);
    s.newCycle();
    s.next();
    expect(s.update([A, B, C])).toBe(true);
    expect(s.pendingIds()).toEqual([C.id, B.id]);
  });

  test("an unattempted peer that leaves is dropped; the active one stays active", () => {
    const s = new PeerSet(scripted([0.1, 0.2, 0.3]));
    s.update([A, B, C]);
    s.newCycle();
    expect(s.next()).toEqual(A);
    expect(s.update([C])).toBe(true);
    expect(s.pendingIds()).toEqual([C.id]);
    expect(s.active).toEqual(A);
    s.fail(); // A left: it is not remembered as tried
    expect(s.triedIds()).toEqual([]);
  });

  test("exhausted → a fresh cycle redraws every priority", () => {
    const s = new PeerSet(scripted([0.1, 0.9, 0.9, 0.1]));
    s.update([A, B]);
    s.newCycle();
    expect([s.next(), (s.fail(), s.next())]).toEqual([A, B]);
    s.fail();
    expect(s.exhausted).toBe(true);
    s.newCycle();
    expect(s.pendingIds()).toEqual([B.id, A.id]);
  });

  test("a tried peer that leaves and comes back is eligible again in the same cycle", () => {
    const s = new PeerSet(scripted([0.1, 0.2, 0.3]));
    s.update([A, B]);
    s.newCycle();
    s.next();
    s.fail();
    s.update([B]);
    s.update([A, B]);
    expect(s.pendingIds()).toContain(A.id);
  });

  test("Backoff grows exponentially to its cap and reset() starts over", () => {
    const b = new Backoff({ initialMs: 10, factor: 2, maxMs: 50 });
    expect([b.next(), b.next(), b.next(), b.next()]).toEqual([10, 20, 40, 50]);
    b.reset();
    expect(b.next()).toBe(10);
  });
});

/** A peer that serves `index`, or fails with `status` while `failing()` says so. */
function servingPeer(index: MapIndex, opts: { hold?: Promise<void>; status?: () => number } = {}) {
  const handler = dumpHandler({ source: index, ready: () => true, logger: quietLogger() });
  return startPeer(async (req) => {
    await opts.hold;
    const status = opts.status?.() ?? 200;
    return status === 200 ? handler(req) : new Response("nope", { status });
  });
}

describe("recovery loop and the candidate model", () => {
  test("an in-flight dump survives unchanged EndpointSlice churn", async () => {
    const held = gate();
    const a = servingPeer(sampleIndex(), { hold: held.wait });
    const b = servingPeer(sampleIndex());
    const disc = new ManualDiscovery([a.peer, b.peer]);
    const states: RecoveryState[] = [];
    const target = new MapIndex();
    const run = runRecovery({ discovery: disc, target, timeoutMs: 10_000, logger: quietLogger(), random: scripted([0.1, 0.9]), onState: (s) => states.push(s) });
    await until(() => a.requests() === 1, "the attempt on A");
    for (let i = 0; i < 20; i++) disc.set(i % 2 ? [b.peer, a.peer] : [a.peer, b.peer]);
    held.open();
    const out = await run;
    expect(out).toMatchObject({ kind: "recovered", peer: a.peer.id, events: 6 });
    expect(states.filter((s) => s.kind === "attempting").length).toBe(1);
    expect(b.requests()).toBe(0);
    expect(target.snapshot()).toEqual(sampleIndex().snapshot());
    a.stop();
    b.stop();
  });

  test("the active peer leaving does not cancel its request, which may still recover", async () => {
    const held = gate();
    const a = servingPeer(sampleIndex(), { hold: held.wait });
    const disc = new ManualDiscovery([a.peer]);
    const run = runRecovery({ discovery: disc, target: new MapIndex(), timeoutMs: 10_000, logger: quietLogger() });
    await until(() => a.requests() === 1, "the attempt on A");
    disc.set([]);
    held.open();
    expect(await run).toMatchObject({ kind: "recovered", peer: a.peer.id });
    a.stop();
  });

  test("a peer joining during recovery is tried; an unattempted peer that left is not", async () => {
    const held = gate();
    const a = servingPeer(sampleIndex(), { hold: held.wait, status: () => 500 });
    const b = servingPeer(sampleIndex());
    const c = servingPeer(sampleIndex(3, 1, 2));
    const disc = new ManualDiscovery([a.peer, b.peer]);
    const run = runRecovery({ discovery: disc, target: new MapIndex(), timeoutMs: 10_000, logger: quietLogger(), random: scripted([0.1, 0.5, 0.3]) });
    await until(() => a.requests() === 1, "the attempt on A");
    disc.set([a.peer, c.peer]); // B leaves unattempted, C joins
    held.open();
    expect(await run).toMatchObject({ kind: "recovered", peer: c.peer.id, events: 3 });
    expect(b.requests()).toBe(0);
    for (const p of [a, b, c]) p.stop();
  });

  test("an exhausted set starts a new randomized cycle after a backoff that grows, and resets only on a real change", async () => {
    let failing = true;
    const a = servingPeer(sampleIndex(), { status: () => (failing ? 500 : 200) });
    const b = servingPeer(sampleIndex(), { status: () => 500 });
    const c = servingPeer(sampleIndex(), { status: () => 500 });
    const disc = new ManualDiscovery([a.peer, b.peer]);
    const delays: number[] = [];
    const orders: string[][] = [];
    const onState = (s: RecoveryState) => {
      if (s.kind === "attempting") (orders[s.cycle - 1] ??= []).push(s.peer.id);
      if (s.kind !== "backing_off") return;
      delays.push(s.delayMs);
      if (delays.length === 3) queueMicrotask(() => disc.set([b.peer, a.peer])); // churn, same set
      if (delays.length === 4) queueMicrotask(() => disc.set([a.peer, b.peer, c.peer])); // a real change
      if (delays.length === 6) failing = false;
    };
    // maxPeerFailures 0: peers are never set aside here, whatever their failures (that rule has its own tests).
    const out = await runRecovery({ discovery: disc, target: new MapIndex(), timeoutMs: 10_000, logger: quietLogger(), backoff: { initialMs: 5, factor: 2, maxMs: 1000, jitter: 0 }, onState, maxPeerFailures: 0 });
    expect(out).toMatchObject({ kind: "recovered", peer: a.peer.id });
    // 5, 10, 20, 40 (unchanged churn did not reset), then C joined: back to 5, 10.
    expect(delays).toEqual([5, 10, 20, 40, 5, 10]);
    // Every cycle tries each eligible peer exactly once.
    for (const order of orders.slice(0, 3)) expect([...order].sort()).toEqual([a.peer.id, b.peer.id].sort());
    // Never the same peer twice in one cycle (the redraw of priorities itself is tested on PeerSet).
    for (const order of orders) expect(new Set(order).size).toBe(order.length);
    for (const p of [a, b, c]) p.stop();
  });

  test("all peers leaving while backing off ends in an empty bootstrap", async () => {
    const a = servingPeer(sampleIndex(), { status: () => 500 });
    const disc = new ManualDiscovery([a.peer]);
    const out = await runRecovery({
      discovery: disc,
      target: new MapIndex(),
      timeoutMs: 10_000,
      logger: quietLogger(),
      backoff: { initialMs: 60_000 },
      onState: (s) => s.kind === "backing_off" && queueMicrotask(() => disc.set([])),
    });
    expect(out).toEqual({ kind: "empty_bootstrap", reason: "all_peers_left" });
    a.stop();
  });

  test("no peer source → recovery_disabled; no eligible peer → empty bootstrap at once", async () => {
    expect(await runRecovery({ discovery: null, target: new MapIndex(), timeoutMs: 1000, logger: quietLogger() })).toEqual({ kind: "recovery_disabled" });
    const disc = new ManualDiscovery([]);
    expect(await runRecovery({ discovery: disc, target: new MapIndex(), timeoutMs: 1000, logger: quietLogger() })).toEqual({ kind: "empty_bootstrap", reason: "no_serving_peer" });
    expect(disc.stopped).toBe(true);
    const kept = new ManualDiscovery([]);
    await runRecovery({ discovery: kept, target: new MapIndex(), timeoutMs: 1000, logger: quietLogger(), keepDiscovery: true });
    expect(kept.stopped).toBe(false);
  });
});
