// The index module's pre-formatted /dump events (KvIndex.dumpJsonChunks, used by the writer through
// DumpModel.eventsJson) against the TypeScript writer formatting the same index's dump() events.
import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { KvIndex } from "@kv-epp/index-wasm";
import { workerKey } from "@kv-epp/protocol";
import { applyStored } from "@kv-epp/index-wasm/helpers";
import { DumpFetchError, dumpHandler, dumpStream, fetchDump, type DumpSource, type DumpTarget } from "../src/index.ts";
import { indexSource, indexTarget } from "../bench/fixture.ts";
import { quietLogger, readAll, startPeer } from "./helpers.ts";

const U64_MAX = 0xffff_ffff_ffff_ffffn;

function bodyOf(source: DumpSource, chunkBytes: number): Promise<Uint8Array> {
  return readAll(dumpStream(source, { chunkBytes }));
}

/** Two models from generated stored events; workers with odd ids, ranks, u64 extremes. */
const u64 = fc.oneof(fc.bigInt({ min: 0n, max: U64_MAX }), fc.constantFrom(0n, 1n, 9n, 10n, 99_999_999n, 100_000_000n, 10n ** 16n - 1n, 10n ** 16n, 2n ** 63n, U64_MAX));
const worker = fc.record({ workerId: fc.string({ unit: "grapheme", maxLength: 8 }), dpRank: fc.nat(1000) });
const stored = fc.record({ worker: fc.nat(5), parentPick: fc.nat(50), blocks: fc.array(fc.record({ ext: u64, tok: u64 }), { minLength: 1, maxLength: 7 }) });

/**
 * Emptied for the next run (every worker removed: its slot freed for reuse) instead of a fresh index per
 * run: each KvIndex is a WebAssembly instance with its own linear memory, and JSC reclaims those only by
 * a full collection, which it forces every few instantiations. Measured: 300 instantiations cost 0.1 s
 * of CPU in a small process and 6-22 s beside a suite-sized heap.
 */
function emptied(index: KvIndex): KvIndex {
  for (const w of index.workers()) index.removeWorker(w);
  expect(index.stats()).toMatchObject({ blocks: 0, residencies: 0, workers: 0 });
  return index;
}

function build(index: KvIndex, workers: { workerId: string; dpRank: number }[], events: { worker: number; parentPick: number; blocks: { ext: bigint; tok: bigint }[] }[]): KvIndex {
  const held: bigint[][] = workers.map(() => []);
  for (const e of events) {
    const wi = e.worker % workers.length;
    const mine = held[wi]!;
    // a parent the worker stored (often), else the root
    const parent = mine.length > 0 && e.parentPick % 4 !== 0 ? mine[e.parentPick % mine.length]! : null;
    const r = applyStored(index, workers[wi]!, parent, e.blocks.map((b) => ({ blockHash: b.ext, tokensHash: b.tok })));
    if (r.kind === "applied") for (const b of e.blocks) mine.push(b.ext);
  }
  return index;
}

describe("WASM-formatted dump events", () => {
  test("property: byte-identical to the TypeScript writer for the same index, any chunk size", async () => {
    const indexes = [KvIndex.create({ blockSize: 16 }), KvIndex.create({ blockSize: 16 })] as const;
    await fc.assert(
      fc.asyncProperty(
        fc.uniqueArray(worker, { minLength: 1, maxLength: 5, selector: (w) => workerKey(w) }),
        fc.array(stored, { maxLength: 30 }),
        fc.integer({ min: 1, max: 600 }),
        async (workers, events, chunkBytes) => {
          const a = build(emptied(indexes[0]), workers, events);
          const b = build(emptied(indexes[1]), workers.slice().reverse(), events);
          const models = (json: boolean): DumpSource => ({
            models: () => [...indexSource(a, "m:a", { json }).models(), ...indexSource(b, "m:b", { json }).models()],
          });
          const viaTs = await bodyOf(models(false), chunkBytes);
          const viaWasm = await bodyOf(models(true), chunkBytes);
          expect(Buffer.from(viaWasm).equals(Buffer.from(viaTs))).toBe(true);
        },
      ),
      { numRuns: 150 },
    );
  });

  test("a multi-chunk index: same bytes with 64 KiB chunks, chunks near the requested size", async () => {
    const index = KvIndex.create({ blockSize: 16 });
    for (let w = 0; w < 6; w++) {
      const blocks = Array.from({ length: 3000 }, (_, i) => ({ blockHash: U64_MAX - BigInt(w * 10_000 + i), tokensHash: BigInt(i) * 7919n }));
      applyStored(index, { workerId: `worker-${w}`, dpRank: w % 2 }, null, blocks);
      applyStored(index, { workerId: `worker-${w}`, dpRank: w % 2 }, blocks[100]!.blockHash, [{ blockHash: 5n + BigInt(w), tokensHash: 6n }]);
    }
    const ts = await bodyOf(indexSource(index, "m", { json: false }), 64 * 1024);
    const chunks = [...index.dumpJsonChunks({ chunkBytes: 64 * 1024 })];
    expect(chunks.length).toBeGreaterThan(3);
    for (const c of chunks.slice(0, -1)) expect(c.length).toBeGreaterThanOrEqual(64 * 1024);
    const wasm = await bodyOf(indexSource(index, "m"), 64 * 1024);
    expect(Buffer.from(wasm).equals(Buffer.from(ts))).toBe(true);
  });

  test("recovery of a JSON body over loopback (typed batches written into event runs): the recovered index dumps the same bytes", async () => {
    const index = KvIndex.create({ blockSize: 16 });
    for (let w = 0; w < 5; w++) {
      const worker = { workerId: `worker-${w}`, dpRank: w % 3 };
      for (let c = 0; c < 40; c++) {
        const blocks = Array.from({ length: 1 + ((w + c) % 9) }, (_, i) => ({ blockHash: U64_MAX - BigInt(w * 1e6 + c * 100 + i), tokensHash: BigInt(c * 100 + i) }));
        applyStored(index, worker, null, blocks);
        applyStored(index, worker, blocks[0]!.blockHash, [{ blockHash: BigInt(w * 1e6 + c + 1), tokensHash: 2n ** 63n + BigInt(c) }]);
      }
    }
    const source = await bodyOf(indexSource(index, "m:t"), 1024);
    const peer = startPeer(dumpHandler({ source: indexSource(index, "m:t"), ready: () => true, logger: quietLogger(), chunkBytes: 1024 }));
    try {
      {
        let got: Map<string, KvIndex> | undefined;
        const r = await fetchDump({ peer: peer.peer, target: indexTarget((m) => (got = m)), timeoutMs: 10_000, format: "json" });
        expect(r.events).toBeGreaterThan(200);
        const recovered = got!.get("m:t")!;
        expect(recovered.stats().residencies).toBe(index.stats().residencies);
        expect(Buffer.from(await bodyOf(indexSource(recovered, "m:t"), 1024)).equals(Buffer.from(source))).toBe(true);
      }
      // an index error while a run is applied fails the attempt as "apply", and the staging is aborted
      let aborted = false;
      const failing: DumpTarget = {
        begin: () => ({
          accepts: () => true,
          model() {},
          events() { throw new Error("index full"); },
          extras() {},
          stagedBytes: () => 0,
          commit() {},
          abort() { aborted = true; },
        }),
      };
      const err = await fetchDump({ peer: peer.peer, target: failing, timeoutMs: 10_000, format: "json" }).catch((e) => e);
      expect(err).toBeInstanceOf(DumpFetchError);
      expect((err as DumpFetchError).reason).toBe("apply");
      expect(aborted).toBe(true);
    } finally {
      peer.stop();
    }
  });
});
