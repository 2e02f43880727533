// dumpBinaryChunks and applyDumpEvents: an index rebuilt from its binary dump dumps the same events
// (the JSON dump compared byte for byte), for any chunk size; malformed words apply nothing.
import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { KvIndex, type WorkerRef } from "../src/index.ts";
import { applyStored } from "../src/helpers.ts";
import { randomEvents, randomIndex } from "./random-index.ts";

const json = (index: KvIndex) => Buffer.concat([...index.dumpJsonChunks()]).toString();

/** What an index holds, order-free: per worker, each block with its parent, tokens hash and copies (sibling order may differ). */
function content(index: KvIndex): string[] {
  const out: string[] = [];
  for (const e of index.dump()) {
    let parent = e.parentHash;
    for (const b of e.blocks) {
      out.push(`${e.worker.workerId}/${e.worker.dpRank} ${parent} ${b.blockHash} ${b.tokensHash} ${b.copies ?? 1}`);
      parent = b.blockHash;
    }
  }
  return out.sort();
}

/** Rebuilds an index from another's binary dump, as a receiver does. */
function rebuild(from: KvIndex, chunkBytes?: number): KvIndex {
  const to = KvIndex.create({ blockSize: from.blockSize });
  let worker: WorkerRef | null = null;
  for (const item of from.dumpBinaryChunks({ chunkBytes })) {
    if (!(item instanceof Uint8Array)) worker = { workerId: item.workerId, dpRank: item.dpRank };
    else {
      expect(item.length % 8).toBe(0);
      expect(to.applyDumpEvents(worker!, item).rejected).toBe(0);
    }
  }
  return to;
}

describe("dumpBinaryChunks / applyDumpEvents", () => {
  test("property: an index rebuilt from its binary dump holds the same blocks, copies and zero-copy prefixes included", () => {
    fc.assert(
      fc.property(
        randomEvents(),
        fc.integer({ min: 1, max: 400 }),
        (events, chunkBytes) => {
          const index = randomIndex(events);
          const copy = rebuild(index, chunkBytes);
          expect(content(copy)).toEqual(content(index));
          expect(copy.stats().residencies).toBe(index.stats().residencies);
        },
      ),
      { numRuns: 100 },
    );
  }, 30_000);

  test("chunks hold whole events; an event larger than the chunk size comes whole in a chunk of its own", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const w = { workerId: "w", dpRank: 0 };
    applyStored(index, w, null, Array.from({ length: 5000 }, (_, i) => ({ blockHash: BigInt(i + 1), tokensHash: BigInt(i * 7) })));
    applyStored(index, { workerId: "v", dpRank: 2 }, null, [{ blockHash: 1n, tokensHash: 2n }]);
    const items = [...index.dumpBinaryChunks({ chunkBytes: 1024 })];
    expect(items.filter((x) => !(x instanceof Uint8Array))).toEqual([w, { workerId: "v", dpRank: 2 }]);
    const big = items[1] as Uint8Array;
    expect(big.length).toBe(8 * (1 + 2 * 5000));
    const words = new BigUint64Array(big.buffer, big.byteOffset, big.length / 8);
    expect(words[0]).toBe(5000n << 32n); // no parent, no copies, 5000 blocks
    expect(words[1]).toBe(1n);
    expect(words[5001]).toBe(0n);
    expect(json(rebuild(index, 1024))).toBe(json(index));
  });

  test("malformed words apply nothing and throw; the index stays usable", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const w = { workerId: "w", dpRank: 0 };
    const ok = new BigUint64Array([1n << 32n, 5n, 6n]);
    const bytes = (ws: BigUint64Array) => new Uint8Array(ws.buffer);
    for (const bad of [
      new BigUint64Array([...ok, 4n]), // unknown flag
      new BigUint64Array([...ok, 3n << 32n, 1n]), // count past the end
      new BigUint64Array([...ok, (0xffff_ffffn << 32n) | 2n]), // a huge count with copies
    ]) expect(() => index.applyDumpEvents(w, bytes(bad))).toThrow(/malformed dump events/);
    expect(() => index.applyDumpEvents(w, new Uint8Array(12))).toThrow(/whole number/);
    expect(index.stats().residencies).toBe(0);
    expect(index.applyDumpEvents(w, bytes(ok)).blocks).toBe(1);
    expect(index.stats().residencies).toBe(1);
  });
});
