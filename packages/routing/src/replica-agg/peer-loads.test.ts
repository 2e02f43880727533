import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { ActiveLoad } from "../load.ts";
import { DEFAULT_PENDING, PendingPrefixes } from "../pending.ts";
import { workerKeyOf } from "@kv-epp/protocol";
import { decodeAggMessage, encodeAggMessage, opOf, type AggMessage, type AggOp } from "./codec.ts";
import { AggOutbox } from "./outbox.ts";
import { PeerLoads } from "./peer-loads.ts";

const W0 = workerKeyOf("w-0", 0);
const W1 = workerKeyOf("w-1", 0);
const added = (id: number, workerKey = W0, blocks = 10, prefillBlocks = 4): AggOp => ({ op: "added", entry: { id, workerKey, blocks, prefillBlocks } });
const delta = (seq: number, ops: AggOp[], replica = "A"): AggMessage => ({ kind: "delta", replica, seq, ops });
const snapshot = (seq: number, ids: number[], replica = "A"): AggMessage => ({
  kind: "snapshot",
  replica,
  seq,
  entries: ids.map((id) => ({ id, workerKey: W0, blocks: 10, prefillBlocks: 0 })),
});

describe("peer load aggregation", () => {
  test("deltas add, mark prefilled and free a peer's requests; totals are per worker", () => {
    const s = new PeerLoads("me");
    expect(s.receive("sib", delta(0, [added(1), added(2, W1, 6, 6)]), 0)).toEqual({ kind: "applied", via: "baseline", missed: 0, previous: undefined });
    expect([s.of(W0).blocks, s.of(W0).requests, s.of(W0).prefillBlocks, s.of(W0).prefillRequests, s.of(W1).blocks]).toEqual([10, 1, 4, 1, 6]);
    expect(s.replicas()).toEqual({ self: "me", peers: ["A"] });
    s.receive("sib", delta(1, [{ op: "prefilled", id: 1 }]), 1);
    expect([s.of(W0).prefillBlocks, s.of(W0).prefillRequests]).toEqual([0, 0]);
    s.receive("sib", delta(2, [{ op: "freed", id: 1 }]), 2);
    expect([s.of(W0).blocks, s.of(W0).requests, s.of(W1).blocks, s.requestCount]).toEqual([0, 0, 6, 1]);
  });

  test("a duplicate (seq already seen) is ignored", () => {
    const s = new PeerLoads("me");
    s.receive("sib", delta(5, [added(1)]), 0);
    s.receive("sib", delta(6, [{ op: "freed", id: 1 }]), 0);
    expect(s.receive("sib", delta(5, [added(1)]), 0)).toEqual({ kind: "duplicate" });
    expect(s.requestCount).toBe(0);
  });

  test("a gap is counted, the message still applies, and the next snapshot makes the table exact", () => {
    const s = new PeerLoads("me");
    s.receive("sib", delta(0, [added(1), added(2)]), 0);
    // seq 1 (freeing request 1) is lost: request 1 is a phantom until the snapshot.
    expect(s.receive("sib", delta(2, [added(3)]), 0)).toMatchObject({ kind: "applied", via: "gap", missed: 1 });
    expect(s.requestCount).toBe(3);
    expect(s.status()[0]).toMatchObject({ state: "following", exact: false });
    s.receive("sib", snapshot(3, [2, 3]), 0);
    expect(s.requestCount).toBe(2);
    expect(s.of(W0).blocks).toBe(20);
    expect(s.status()[0]).toMatchObject({ exact: true });
  });

  test("a new replica id is a restarted peer: its old load is dropped and it starts from zero", () => {
    const s = new PeerLoads("me");
    s.receive("sib", snapshot(40, [1, 2, 3]), 0);
    expect(s.requestCount).toBe(3);
    expect(s.receive("sib", delta(0, [added(1, W1, 5, 5)], "B"), 0)).toMatchObject({ kind: "applied", via: "restart", previous: "A" });
    expect([s.of(W0).blocks, s.of(W1).blocks]).toEqual([0, 5]);
    // seq restarted at 0: not a duplicate of the old replica's 40.
    expect(s.receive("sib", delta(1, [added(2, W1, 5, 5)], "B"), 0)).toMatchObject({ kind: "applied", via: "in_order" });
    expect(s.of(W1).blocks).toBe(10);
  });

  test("a peer with no snapshot for the timeout is dropped, and followed again when heard", () => {
    const s = new PeerLoads("me");
    s.receive("sib", snapshot(0, [1, 2]), 1000);
    // Deltas alone do not keep a peer alive: only snapshots prove the table is not stale.
    s.receive("sib", delta(1, [added(3)]), 3500);
    expect(s.sweep(3900, 3000)).toEqual([]);
    expect(s.sweep(4001, 3000)).toEqual([{ peer: "sib", requests: 3, silentMs: 3001 }]);
    expect([s.requestCount, s.of(W0).blocks]).toEqual([0, 0]);
    expect(s.status()[0]).toMatchObject({ state: "waiting" });
    expect(s.receive("sib", snapshot(9, [1]), 9000)).toMatchObject({ kind: "applied", via: "baseline" });
    expect(s.requestCount).toBe(1);
  });

  test("a dropped connection drops the load; a removed peer is forgotten", () => {
    const s = new PeerLoads("me");
    s.add("a");
    s.add("b");
    s.receive("a", snapshot(0, [1, 2]), 0);
    s.receive("b", snapshot(0, [1], "B"), 0);
    expect(s.of(W0).blocks).toBe(30);
    expect(s.drop("a")).toBe(2);
    expect(s.of(W0).blocks).toBe(10);
    expect(s.remove("b")).toBe(1);
    expect(s.of(W0).blocks).toBe(0);
    expect(s.status().map((x) => x.peer)).toEqual(["a"]);
  });

  test("messages carrying this replica's own id are ignored", () => {
    const s = new PeerLoads("me");
    expect(s.receive("self", snapshot(0, [1], "me"), 0)).toEqual({ kind: "self" });
    expect(s.requestCount).toBe(0);
  });

  test("whatever messages are lost or duplicated, the first snapshot after them makes the mirror exact", () => {
    const ops = fc.array(fc.oneof(fc.constant("acquire" as const), fc.constant("prefill" as const), fc.constant("release" as const), fc.constant("flush" as const)), { maxLength: 80 });
    const fate = fc.array(fc.constantFrom("deliver", "deliver", "deliver", "lose", "duplicate"), { minLength: 100, maxLength: 100 });
    fc.assert(
      fc.property(ops, fate, fc.integer({ min: 0, max: 1000 }), (script, fates, seed) => {
        const load = new ActiveLoad();
        const outbox = new AggOutbox("A");
        const mirror = new PeerLoads("me");
        const leases: ReturnType<ActiveLoad["acquire"]>[] = [];
        let pending: AggOp[] = [];
        load.observe((c) => pending.push(opOf(c)));
        let r = seed;
        const next = () => (r = (r * 16807) % 2147483647) % 1000;
        const deliver = (m: AggMessage, i: number) => {
          const wire = decodeAggMessage(encodeAggMessage(m));
          const f = fates[i % fates.length];
          if (f !== "lose") mirror.receive("sib", wire, 0);
          if (f === "duplicate") mirror.receive("sib", wire, 0);
        };
        script.forEach((op, i) => {
          if (op === "acquire") leases.push(load.acquire(next() % 2 ? W0 : W1, 1 + (next() % 50), next() % 2));
          else if (op === "prefill" && leases.length) leases[next() % leases.length]!.prefilled();
          else if (op === "release" && leases.length) leases.splice(next() % leases.length, 1)[0]!.release();
          else if (op === "flush" && pending.length) {
            deliver(outbox.delta(pending), i);
            pending = [];
          }
        });
        if (pending.length) deliver(outbox.delta(pending), 0);
        mirror.receive("sib", decodeAggMessage(encodeAggMessage(outbox.snapshot(load))), 0);
        for (const k of [W0, W1]) {
          expect(mirror.of(k).blocks).toBe(load.of(k).blocks);
          expect(mirror.of(k).requests).toBe(load.of(k).requests);
          expect(mirror.of(k).prefillBlocks).toBe(load.of(k).prefillBlocks);
          expect(mirror.of(k).prefillRequests).toBe(load.of(k).prefillRequests);
        }
      }),
    );
  });
});

describe("peers' in-flight prefixes", () => {
  const keys = (...k: number[]) => Float64Array.from(k);
  const overlaps = (p: PendingPrefixes, q: Float64Array) => {
    const out = new Map<string, number>();
    p.overlapsInto(q, out);
    return out;
  };
  const withPrefix = (id: number, prefix: Float64Array, workerKey = W0): AggOp => ({ op: "added", entry: { id, workerKey, blocks: prefix.length, prefillBlocks: prefix.length }, prefix });

  test("a peer's request with prefix keys is pending on its worker until the peer frees it", () => {
    const pending = new PendingPrefixes(DEFAULT_PENDING);
    const s = new PeerLoads("me", pending);
    s.receive("sib", delta(0, [withPrefix(1, keys(10, 11, 12)), withPrefix(2, keys(20, 21), W1)]), 0);
    expect(overlaps(pending, keys(10, 11, 99))).toEqual(new Map([[W0, 2]]));
    expect(overlaps(pending, keys(20, 21, 22))).toEqual(new Map([[W1, 2]]));
    s.receive("sib", delta(1, [{ op: "prefilled", id: 1 }]), 1); // still in flight: the index may not know it yet
    expect(overlaps(pending, keys(10))).toEqual(new Map([[W0, 1]]));
    s.receive("sib", delta(2, [{ op: "freed", id: 1 }]), 2);
    expect(overlaps(pending, keys(10))).toEqual(new Map());
    expect(pending.size).toBe(1);
  });

  test("a snapshot without a request drops its prefix (its freed was lost); a drop or a restart drops them all", () => {
    const pending = new PendingPrefixes(DEFAULT_PENDING);
    const s = new PeerLoads("me", pending);
    s.receive("sib", delta(0, [withPrefix(1, keys(10, 11)), withPrefix(2, keys(30))]), 0);
    s.receive("sib", snapshot(2, [2]), 1); // seq 1 (freeing 1) was lost
    expect(overlaps(pending, keys(10))).toEqual(new Map());
    expect(overlaps(pending, keys(30))).toEqual(new Map([[W0, 1]]));
    s.receive("sib", delta(3, [withPrefix(3, keys(40))]), 2);
    expect(pending.size).toBe(2);
    s.receive("sib", delta(0, [withPrefix(1, keys(50))], "A2"), 3); // restarted: a new replica id
    expect(pending.size).toBe(1);
    expect(overlaps(pending, keys(50))).toEqual(new Map([[W0, 1]]));
    s.drop("sib");
    expect(pending.size).toBe(0);
  });

  test("this replica's own leases publish their prefix keys only with in-flight prefixes on; a peer without a PendingPrefixes ignores them", () => {
    const pending = new PendingPrefixes(DEFAULT_PENDING);
    const seen: AggOp[] = [];
    const on = new ActiveLoad(pending);
    on.observe((c) => seen.push(opOf(c)));
    on.acquire(W0, 3, 3, keys(1, 2, 3));
    const off = new ActiveLoad();
    off.observe((c) => seen.push(opOf(c)));
    off.acquire(W0, 3, 3, keys(1, 2, 3));
    expect(seen.map((o) => "prefix" in o)).toEqual([true, false]);
    const wire = decodeAggMessage(encodeAggMessage(delta(0, [seen[0]!])));
    const plain = new PeerLoads("me");
    plain.receive("sib", wire, 0);
    expect(plain.of(W0).requests).toBe(1);
  });
});
