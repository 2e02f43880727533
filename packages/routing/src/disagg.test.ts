import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { computeBlockHashes, KvIndex } from "@kv-epp/index-wasm";
import { applyStored } from "@kv-epp/index-wasm/helpers";
import { workerKey, type WorkerRef, type WorkerRole } from "@kv-epp/protocol";
import { decideDisagg, roleSets } from "./disagg.ts";
import { explanation } from "./explain.ts";
import { LatencyModel, uncachedTokens } from "./latency.ts";
import { ActiveLoad, sumLoad } from "./load.ts";
import { PendingPrefixes, DEFAULT_PENDING } from "./pending.ts";
import type { ReplicaSet } from "./home.ts";
import { Picker, type Decision } from "./picker.ts";
import { NO_METRICS, type Candidate } from "./ports.ts";
import { REMOTE_PREFILL_MIN_DEADLINE_MS, RoutedRequest, type RoutingContext } from "./routed-request.ts";

const BLOCK = 4;
const ips = new Map<string, number>();
/** A rank of its own worker, on an IP of its own. */
const rank = (workerId: string, role?: WorkerRole): Candidate => {
  const w: WorkerRef = { workerId, dpRank: 0 };
  if (!ips.has(workerId)) ips.set(workerId, ips.size + 1);
  return { ...w, key: workerKey(w), endpoint: `10.0.${ips.get(workerId)! >> 8}.${ips.get(workerId)! & 255}:8000`, rankHeader: undefined, ...(role ? { role } : {}) };
};
const prompt = (blocks: number, seed = 1) => Uint32Array.from({ length: blocks * BLOCK }, (_, i) => seed * 100_000 + i + 1);

/** A pool over one index; `holds` stores a prompt's first blocks on a rank. */
function pool(candidates: Candidate[], o: { threshold?: number; cost?: "weights" | "latency"; pending?: boolean; replicas?: ReplicaSet } = {}) {
  const index = KvIndex.create({ blockSize: BLOCK });
  const pending = o.pending ? new PendingPrefixes({ ...DEFAULT_PENDING }) : undefined;
  const load = new ActiveLoad(pending);
  const latency = new LatencyModel();
  const timers: (() => void)[] = [];
  const delays: number[] = [];
  let next = 1;
  const picker = new Picker({
    indexers: { lookup: () => ({ key: "m", blockSize: BLOCK, index }) },
    candidates: () => candidates,
    load,
    signals: () => undefined,
    options: { prefillLoadScale: 16, decodeLoadScale: 1, queueWeight: 0, temperature: 0, shape: { kind: "blocks" }, queueThreshold: 0, cost: o.cost ?? "weights", pdThresholdTokens: o.threshold ?? 8 },
    latency,
    pending,
    replicas: o.replicas && (() => o.replicas),
    random: () => 0,
  });
  const ctx: RoutingContext = { picker, load, latency, metrics: NO_METRICS, candidates: () => candidates, clock: { now: () => 0, after: (ms, fn) => (delays.push(ms), timers.push(fn), () => {}) } };
  const holds = (c: Candidate, tokens: Uint32Array, blocks: number) => {
    const hashes = computeBlockHashes(tokens.subarray(0, blocks * BLOCK), BLOCK);
    applyStored(index, c, null, [...hashes].map((h) => ({ blockHash: BigInt(next++), tokensHash: h })));
  };
  const route = (tokens: Uint32Array, pathSplit?: boolean) => {
    const r = RoutedRequest.route(ctx, { tokens, pathSplit });
    if (r.kind !== "routed") throw new Error(r.reason);
    return r.request;
  };
  const pick = (tokens: Uint32Array) => picker.pick({ tokens }) as Extract<Decision, { kind: "picked" }>;
  return { load, holds, route, pick, timers, delays };
}

describe("the decider (llm-d's prefix-based rule over the exact overlap)", () => {
  test("property: disaggregates exactly when the decode rank's uncached tokens reach the threshold and a prefill rank is there", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 4096 }),
        fc.integer({ min: 1, max: 64 }),
        fc.nat(300),
        fc.integer({ min: 0, max: 2048 }),
        fc.nat(3),
        (promptTokens, blockSize, overlapRaw, threshold, prefillCandidates) => {
          const overlap = Math.min(overlapRaw, Math.floor(promptTokens / blockSize));
          const v = decideDisagg({ promptTokens, decodeOverlap: overlap, blockSize, thresholdTokens: threshold, prefillCandidates });
          const uncached = uncachedTokens(promptTokens, overlap, blockSize);
          expect(v.uncachedTokens).toBe(uncached);
          expect(v.disaggregate).toBe(threshold > 0 && uncached >= threshold && prefillCandidates > 0);
          // never more than the prompt, and a longer cached prefix never turns a local verdict into a disaggregated one
          expect(uncached).toBeLessThanOrEqual(promptTokens);
          if (overlap > 0) {
            const less = decideDisagg({ promptTokens, decodeOverlap: overlap - 1, blockSize, thresholdTokens: threshold, prefillCandidates });
            if (v.disaggregate) expect(less.disaggregate).toBe(true);
          }
          const reason = threshold <= 0 ? "threshold_off" : uncached < threshold ? "below_threshold" : prefillCandidates === 0 ? "no_prefill_worker" : "uncached_over_threshold";
          expect(v.reason).toBe(reason);
        },
      ),
    );
  });

  test("roles split the pool: both is in both sets, no role is a destination only, and a pool without prefill ranks is not split", () => {
    const sets = roleSets([rank("p", "prefill"), rank("d", "decode"), rank("b", "both"), rank("n")]);
    expect(sets!.decode.map((c) => c.workerId)).toEqual(["d", "b", "n"]);
    expect(sets!.prefill.map((c) => c.workerId)).toEqual(["p", "b"]);
    expect(roleSets([rank("d", "decode"), rank("n")])).toBeUndefined();
  });
});

describe("the pair", () => {
  test("a long prompt goes to a decode rank, with the prefill rank holding its prefix named; the decode rank gets no prefill load", () => {
    const P1 = rank("p1", "prefill");
    const P2 = rank("p2", "prefill");
    const D1 = rank("d1", "decode");
    const D2 = rank("d2", "decode");
    const { load, holds, route } = pool([P1, P2, D1, D2], { threshold: 8 });
    const tokens = prompt(10);
    holds(P2, tokens, 6);
    const r = route(tokens);
    expect(r.decision.pd?.disagg).toMatchObject({ disaggregate: true, reason: "uncached_over_threshold" });
    expect(r.prefillCandidate?.workerId).toBe("p2");
    expect(["d1", "d2"]).toContain(r.candidate.workerId);
    // prefill load on p2 (the 4 blocks it computes), decode load (no prefill) on the destination
    expect(load.of(P2.key)).toEqual({ requests: 1, blocks: 10, prefillBlocks: 4, prefillRequests: 1 });
    expect(load.of(r.candidate.key)).toEqual({ requests: 1, blocks: 10, prefillBlocks: 0, prefillRequests: 0 });
    expect(explanation(r.decision)).toMatch(/; pd: disaggregated reason=uncached_over_threshold uncached_tokens=40 threshold_tokens=8; prefill: worker=p2 dp_rank=0 overlap=6\/10 .*; prefill_runner_up: worker=p1/);
    // the first byte: the prefill rank's lease goes, the decode rank's stays until the end
    r.responseBody(new Uint8Array([1]));
    expect(load.of(P2.key).requests).toBe(0);
    expect(load.of(r.candidate.key).requests).toBe(1);
    r.end();
    expect(load.inflight).toBe(0);
  });

  test("a short prompt, or one the decode rank mostly holds, prefills on the decode rank: no prefill rank, the usual lease", () => {
    const D = rank("d", "decode");
    const { load, holds, route } = pool([rank("p", "prefill"), D], { threshold: 12 });
    const short = route(prompt(2));
    expect(short.decision.pd?.disagg).toMatchObject({ disaggregate: false, reason: "below_threshold", uncachedTokens: 8 });
    expect(short.prefillCandidate).toBeUndefined();
    expect(explanation(short.decision)).toMatch(/; pd: local reason=below_threshold uncached_tokens=8 threshold_tokens=12$/);
    short.end();
    const long = prompt(10, 2);
    holds(D, long, 8);
    const cached = route(long);
    expect(cached.decision.pd?.disagg).toMatchObject({ disaggregate: false, reason: "below_threshold", uncachedTokens: 8 });
    expect(load.of(D.key)).toEqual({ requests: 1, blocks: 10, prefillBlocks: 2, prefillRequests: 1 });
  });

  test("a path the sidecar does not split is a plain decode pick: no prefill rank named or booked, under either cost", () => {
    for (const cost of ["weights", "latency"] as const) {
      const P = rank(`np-p-${cost}`, "prefill");
      const D = rank(`np-d-${cost}`, "decode");
      const { load, holds, route } = pool([P, D], { threshold: 8, cost });
      const tokens = prompt(10, 4);
      holds(P, tokens, 6);
      const r = route(tokens, false);
      expect(r.decision.pd?.disagg).toMatchObject({ disaggregate: false, reason: "path_not_split", uncachedTokens: 40 });
      expect(r.prefillCandidate).toBeUndefined();
      expect(load.of(P.key)).toEqual({ requests: 0, blocks: 0, prefillBlocks: 0, prefillRequests: 0 });
      expect(load.of(D.key)).toEqual({ requests: 1, blocks: 10, prefillBlocks: 10, prefillRequests: 1 });
      expect(explanation(r.decision)).toMatch(/; pd: local reason=path_not_split uncached_tokens=40 threshold_tokens=8$/);
    }
  });

  test("a pool without prefill ranks decides as before: no pd part, the same choice and explanation", () => {
    const plain = [rank("a"), rank("b", "decode")];
    const tokens = prompt(10);
    const withRoles = pool(plain, { threshold: 1 });
    withRoles.holds(plain[1]!, tokens, 3);
    const d = withRoles.pick(tokens);
    expect(d.pd).toBeUndefined();
    expect(d.chosen.candidate.workerId).toBe("b");
    expect(explanation(d)).not.toContain("pd:");
  });

  test("property: decode and unlabelled ranks route as ranks without roles do, request after request, lease for lease", () => {
    fc.assert(
      fc.property(
        fc.array(fc.constantFrom<WorkerRole | undefined>("decode", undefined), { minLength: 1, maxLength: 4 }),
        fc.array(fc.tuple(fc.nat(3), fc.integer({ min: 0, max: 10 }), fc.nat(3)), { maxLength: 6 }),
        fc.array(fc.tuple(fc.nat(3), fc.integer({ min: 1, max: 10 }), fc.boolean()), { minLength: 1, maxLength: 8 }),
        fc.constantFrom<"weights" | "latency">("weights", "latency"),
        (roles, held, requests, cost) => {
          const labelled = roles.map((r, i) => rank(`same${i}`, r));
          const plain = labelled.map(({ role: _role, ...c }) => c);
          const [x, y] = [pool(labelled, { cost, threshold: 1 }), pool(plain, { cost, threshold: 1 })];
          for (const [w, n, seed] of held)
            for (const p of [x, y]) p.holds((p === x ? labelled : plain)[w % roles.length]!, prompt(10, seed), n);
          for (const [seed, blocks, firstByte] of requests) {
            const [a, b] = [x.route(prompt(blocks, seed)), y.route(prompt(blocks, seed))];
            expect(a.decision.pd).toBeUndefined();
            expect(a.candidate.key).toBe(b.candidate.key);
            expect(explanation(a.decision)).toBe(explanation(b.decision));
            if (firstByte) for (const r of [a, b]) r.responseBody(new Uint8Array([1]));
            for (const c of plain) expect(x.load.of(c.key)).toEqual(y.load.of(c.key));
          }
        },
      ),
      { numRuns: 50 },
    );
  });

  test("property: one replica balances the decode ranks by their decode load while decode workers cache the prompts they receive", () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.integer({ min: 8, max: 24 }), fc.nat(2)), { minLength: 4, maxLength: 24 }),
        fc.integer({ min: 2, max: 12 }),
        (requests, shared) => {
          const D = [rank("bal-d1", "decode"), rank("bal-d2", "decode")];
          const { load, holds, route } = pool([rank("bal-p1", "prefill"), rank("bal-p2", "prefill"), ...D], { threshold: 8, cost: "latency", pending: true });
          const system = prompt(shared, 99);
          for (const [i, [blocks, seed]] of requests.entries()) {
            // a shared system prompt, then a tail of the request's own: always long enough to disaggregate
            const tokens = Uint32Array.from([...system, ...prompt(blocks, 1000 * seed + i + 1)]);
            const r = route(tokens);
            expect(r.decision.pd?.disagg.disaggregate).toBe(true);
            // its prefill is done, and the decode worker now holds the whole prompt it read (its KV events)
            r.responseBody(new Uint8Array([1]));
            holds(r.candidate, tokens, Math.floor(tokens.length / BLOCK));
          }
          // every request still decoding: the decode ranks' held blocks differ by at most one request's
          const [a, b] = D.map((d) => load.of(d.key));
          const longest = (shared + Math.max(...requests.map(([n]) => n)));
          expect(Math.abs(a!.blocks - b!.blocks)).toBeLessThanOrEqual(longest);
        },
      ),
      { numRuns: 50 },
    );
  });

  test("at even decode load a disaggregated request goes to the decode rank holding its prefix: it pulls fewer blocks", () => {
    const D1 = rank("pull-d1", "decode");
    const D2 = rank("pull-d2", "decode");
    const { holds, route } = pool([rank("pull-p", "prefill"), D1, D2], { threshold: 8, cost: "latency" });
    const tokens = prompt(20, 7);
    // ties go to the last candidate here (random 0): D1 wins only by what it holds
    holds(D1, tokens, 6);
    const r = route(tokens);
    expect(r.decision.pd?.disagg.disaggregate).toBe(true);
    expect(r.candidate.workerId).toBe("pull-d1");
  });

  test("a both worker is never its own prefill rank; with no other prefill rank the decode rank prefills locally", () => {
    const B = rank("b", "both");
    const { route } = pool([B], { threshold: 4 });
    const r = route(prompt(10));
    expect(r.candidate.workerId).toBe("b");
    expect(r.decision.pd?.disagg).toMatchObject({ disaggregate: false, reason: "no_prefill_worker" });
  });

  test("a prefill-only pool has no destination", () => {
    const picker = pool([rank("p", "prefill")]).pick;
    expect(picker(prompt(4)) as Decision).toEqual({ kind: "no_endpoint", reason: "no_workers" });
  });

  test("the prefill rank is chosen by prefill load: a second long prompt goes to the prefill rank without one in flight", () => {
    const P1 = rank("p1", "prefill");
    const P2 = rank("p2", "prefill");
    const { route } = pool([P1, P2, rank("d", "decode")], { threshold: 4 });
    const first = route(prompt(10, 1));
    const second = route(prompt(10, 2));
    expect(new Set([first.prefillCandidate?.workerId, second.prefillCandidate?.workerId])).toEqual(new Set(["p1", "p2"]));
    // once the first one's prefill is done, its rank is free again
    first.responseBody(new Uint8Array([1]));
    second.responseBody(new Uint8Array([1]));
    const third = route(prompt(10, 3));
    expect(third.prefillCandidate).toBeDefined();
  });

  test("replicas split the prefill ranks by their home share: two replicas send equal prompts to different prefill ranks", () => {
    const cs = [rank("hp1", "prefill"), rank("hp2", "prefill"), rank("hd", "decode")];
    const on = (self: string, peer: string) => pool(cs, { threshold: 4, cost: "latency", replicas: { self, peers: [peer] } }).route(prompt(10)).prefillCandidate!.workerId;
    expect(new Set([on("replica-a", "replica-b"), on("replica-b", "replica-a")])).toEqual(new Set(["hp1", "hp2"]));
  });

  test("in-flight prefixes: a sibling of a disaggregated request finds its blocks pending on the prefill rank before any event", () => {
    const P1 = rank("p1", "prefill");
    const P2 = rank("p2", "prefill");
    const { route } = pool([P1, P2, rank("d", "decode")], { threshold: 4, cost: "latency", pending: true });
    const tokens = prompt(12);
    const first = route(tokens);
    const sibling = route(tokens);
    expect(sibling.prefillCandidate?.workerId).toBe(first.prefillCandidate!.workerId);
    expect(sibling.decision.pd?.prefill?.chosen.pendingOverlap).toBe(12);
  });

  test("property: the prefill rank is the prefill candidate of lowest cost on another worker, and the load booked is released whole", () => {
    fc.assert(
      fc.property(
        fc.array(fc.constantFrom<WorkerRole | undefined>("prefill", "decode", "both", undefined), { minLength: 1, maxLength: 6 }),
        fc.array(fc.tuple(fc.nat(5), fc.integer({ min: 0, max: 10 })), { maxLength: 6 }),
        fc.integer({ min: 1, max: 12 }),
        fc.integer({ min: 0, max: 48 }),
        (roles, held, blocks, threshold) => {
          const cs = roles.map((r, i) => rank(`w${i}`, r));
          const { load, holds, route } = pool(cs, { threshold });
          const tokens = prompt(blocks);
          for (const [i, n] of held) holds(cs[i % cs.length]!, tokens, Math.min(n, blocks));
          let r;
          try {
            r = route(tokens);
          } catch {
            expect(cs.every((c) => c.role === "prefill")).toBe(true);
            return;
          }
          expect(r.candidate.role).not.toBe("prefill");
          const pd = r.decision.pd;
          const prefillRanks = cs.filter((c) => c.role === "prefill" || c.role === "both");
          if (prefillRanks.length === 0) expect(pd).toBeUndefined();
          else {
            expect(pd).toBeDefined();
            const p = pd!.prefill;
            expect(p !== undefined).toBe(pd!.disagg.disaggregate);
            if (p) {
              expect(p.chosen.candidate.workerId).not.toBe(r.candidate.workerId);
              expect(["prefill", "both"]).toContain(p.chosen.candidate.role ?? "none");
              const min = Math.min(...p.scored.map((s) => s.cost));
              expect(p.chosen.cost).toBe(min);
              expect(p.scored.map((s) => s.candidate.workerId).sort()).toEqual(prefillRanks.filter((c) => c.workerId !== r.candidate.workerId).map((c) => c.workerId).sort());
            }
          }
          r.responseBody(new Uint8Array([1]));
          r.end();
          expect(load.inflight).toBe(0);
          for (const c of cs) expect(load.of(c.key).requests).toBe(0);
        },
      ),
      { numRuns: 100 },
    );
  });
});

describe("load per role across replicas", () => {
  test("a peer's view (its own ops replayed) follows the prefill lease to the first byte and the decode lease to the end", async () => {
    const { PeerLoads } = await import("./replica-agg/peer-loads.ts");
    const { AggOutbox } = await import("./replica-agg/outbox.ts");
    const { decodeAggMessage, encodeAggMessage, opOf } = await import("./replica-agg/codec.ts");
    const P = rank("p", "prefill");
    const D = rank("d", "decode");
    const { load, route } = pool([P, D], { threshold: 4 });
    const outbox = new AggOutbox("replica-a");
    const peer = new PeerLoads("replica-b");
    // what replica-b hears, through the wire format
    load.observe((c) => peer.receive("a", decodeAggMessage(encodeAggMessage(outbox.delta([opOf(c)]))), 0));
    const both = sumLoad(peer);
    const r = route(prompt(10));
    expect(both.of(P.key)).toEqual({ requests: 1, blocks: 10, prefillBlocks: 10, prefillRequests: 1 });
    expect(both.of(D.key)).toEqual({ requests: 1, blocks: 10, prefillBlocks: 0, prefillRequests: 0 });
    r.responseBody(new Uint8Array([1]));
    expect(both.of(P.key).requests).toBe(0);
    expect(both.of(D.key).requests).toBe(1);
    r.end();
    expect(both.of(D.key).requests).toBe(0);
  });

  test("a response that shows no byte until its end releases the prefill lease at its deadline, never before the remote prefill's least", () => {
    const P = rank("p", "prefill");
    const { load, route, timers, delays } = pool([P, rank("d", "decode")], { threshold: 4 });
    route(prompt(10));
    expect(delays).toEqual([REMOTE_PREFILL_MIN_DEADLINE_MS]);
    expect(load.of(P.key).requests).toBe(1);
    for (const t of timers) t();
    expect(load.of(P.key).requests).toBe(0);
  });

  test("a prefill rank that holds the whole prompt (nothing ahead) still has its lease released at the deadline", () => {
    const P = rank("p", "prefill");
    const { load, holds, route, timers, delays } = pool([P, rank("d", "decode")], { threshold: 4 });
    const tokens = prompt(10, 2);
    holds(P, tokens, 10);
    const r = route(tokens);
    expect(r.decision.pd?.prefill?.chosen.candidate.key).toBe(P.key);
    expect(load.of(P.key)).toMatchObject({ requests: 1, prefillBlocks: 0 });
    expect(delays).toEqual([REMOTE_PREFILL_MIN_DEADLINE_MS]);
    for (const t of timers) t();
    expect(load.of(P.key).requests).toBe(0);
  });
});
