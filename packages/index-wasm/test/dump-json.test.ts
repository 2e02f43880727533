// dumpJsonChunks against a reference formatting of dump()'s events (BigInt toString, JSON.stringify).
import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { KvIndex } from "../src/index.ts";
import { applyRemoved, applyStored } from "../src/helpers.ts";
import { emptied, randomEvents, randomIndex } from "./random-index.ts";

function reference(index: KvIndex, firstEventId = 0): string {
  let id = firstEventId;
  const parts: string[] = [];
  for (const e of index.dump()) {
    const blocks = e.blocks.map((b) => `{"block_hash":${b.blockHash},"tokens_hash":${b.tokensHash}${b.copies === undefined ? "" : `,"copies":${b.copies}`}}`).join(",");
    parts.push(`{"worker_id":${JSON.stringify(e.worker.workerId)},"event":{"event_id":${id++},"data":{"stored":{"parent_hash":${e.parentHash ?? "null"},"blocks":[${blocks}]}}},"dp_rank":${e.worker.dpRank}}`);
  }
  return parts.join(",");
}

const text = (chunks: Uint8Array[]) => new TextDecoder().decode(Buffer.concat(chunks));
const U64_MAX = 0xffff_ffff_ffff_ffffn;

describe("dumpJsonChunks", () => {
  test("property: equals the reference formatting of dump(), for any chunk size and first event id", () => {
    const reused = KvIndex.create({ blockSize: 16 });
    fc.assert(
      fc.property(
        randomEvents(),
        fc.integer({ min: 1, max: 400 }),
        fc.oneof(fc.constant(0), fc.nat(), fc.constant(2 ** 40)),
        (events, chunkBytes, firstEventId) => {
          const index = randomIndex(events, emptied(reused));
          expect(text([...index.dumpJsonChunks({ chunkBytes, firstEventId })])).toBe(reference(index, firstEventId));
        },
      ),
      { numRuns: 200 },
    );
  });

  test("an empty index gives no chunks; an abandoned iteration releases its buffers", () => {
    const index = KvIndex.create({ blockSize: 16 });
    expect([...index.dumpJsonChunks()]).toEqual([]);
    for (let w = 0; w < 4; w++) {
      applyStored(index, { workerId: `w${w}`, dpRank: 0 }, null, Array.from({ length: 2000 }, (_, i) => ({ blockHash: BigInt(w * 1e6 + i), tokensHash: BigInt(i) })));
    }
    const abandon = () => {
      const it = index.dumpJsonChunks({ chunkBytes: 1000 });
      it.next();
      it.return(undefined);
    };
    abandon(); // the first dump takes its buffers and cache from fresh memory
    const bytes = index.stats().bytes;
    for (let k = 0; k < 50; k++) abandon();
    // each abandoned dump held a worker snapshot, buffers and the dump cache: released, so memory did not grow with k
    expect(index.stats().bytes).toBe(bytes);
    expect(text([...index.dumpJsonChunks({ chunkBytes: 1000 })])).toBe(reference(index));
  });

  test("the index may change between chunks: workers not yet reached are dumped as they are then", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const w0 = { workerId: "w0", dpRank: 0 }, w1 = { workerId: "w1", dpRank: 0 };
    applyStored(index, w0, null, Array.from({ length: 500 }, (_, i) => ({ blockHash: BigInt(i + 1), tokensHash: BigInt(i) })));
    applyStored(index, w1, null, Array.from({ length: 500 }, (_, i) => ({ blockHash: BigInt(i + 1000), tokensHash: BigInt(i) })));
    applyStored(index, w1, 1010n, [{ blockHash: 77n, tokensHash: 999n }]);
    const it = index.dumpJsonChunks({ chunkBytes: 100 });
    const chunks = [it.next().value as Uint8Array]; // worker 0 is snapshotted (with the dump cache for both)
    // w1's leaf is dropped and a new one stored: the freed node is reused for another block hash
    applyRemoved(index, w1, [77n]);
    applyStored(index, w1, 1020n, [{ blockHash: 88n, tokensHash: 555n }]);
    for (let r = it.next(); !r.done; r = it.next()) chunks.push(r.value);
    expect(text(chunks)).toBe(reference(index));
    expect(text(chunks)).toContain('"block_hash":88,');
  });

  test("onSnapshot names each worker in the step its blocks are copied, so state read then matches the dump", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const ws = [0, 1, 2].map((w) => ({ workerId: `w${w}`, dpRank: 0 }));
    // a count of stores kept beside the index, bumped with each one: what a stream cursor is
    const applied = new Map<string, number>();
    let next = 1n;
    const store = (w: { workerId: string; dpRank: number }) => {
      const h = next++;
      applyStored(index, w, null, [{ blockHash: h, tokensHash: h }]); // roots: one dump event per block
      applied.set(w.workerId, (applied.get(w.workerId) ?? 0) + 1);
    };
    for (const w of ws) for (let i = 0; i < 300; i++) store(w);
    for (const mode of ["json", "events"] as const) {
      const seen = new Map<string, number>();
      const onSnapshot = (w: { workerId: string }) => seen.set(w.workerId, applied.get(w.workerId)!);
      const dumped = new Map<string, number>();
      const it = mode === "json" ? index.dumpJsonChunks({ chunkBytes: 200, onSnapshot }) : index.dump({ onSnapshot })[Symbol.iterator]();
      for (let r = it.next(); !r.done; r = it.next()) {
        if (mode === "json") {
          for (const m of new TextDecoder().decode(r.value as Uint8Array).matchAll(/"worker_id":"(w\d)"/g)) dumped.set(m[1]!, (dumped.get(m[1]!) ?? 0) + 1);
        } else {
          const e = r.value as { worker: { workerId: string }; blocks: unknown[] };
          dumped.set(e.worker.workerId, (dumped.get(e.worker.workerId) ?? 0) + e.blocks.length);
        }
        // live stores between steps, to every worker (dumped already or not yet)
        for (const w of ws) store(w);
      }
      expect(seen.size).toBe(3);
      // each worker's dumped blocks are exactly the stores counted when it was named, not those made later
      expect(dumped).toEqual(seen);
      expect([...seen.values()].every((n, i, all) => i === 0 || n > all[i - 1]!)).toBe(true);
    }
  });
});
