import { expect, test } from "bun:test";
import fc from "fast-check";
import { DUMP_EVENT_FLAGS, type RouterEvent, type StoredBlock } from "@kv-epp/protocol";
import { DumpBatch } from "./batch.ts";
import { EventRunWriter, runEvents } from "./event-run.ts";

const worker = { workerId: "w", dpRank: 3 };
const u64 = fc.bigInt({ min: 0n, max: (1n << 64n) - 1n });
const block = fc.record({ blockHash: u64, tokensHash: u64, copies: fc.option(fc.integer({ min: 0, max: 2 ** 32 - 1 }), { nil: undefined }) }).map(
  (b): StoredBlock => (b.copies === undefined || b.copies === 1 ? { blockHash: b.blockHash, tokensHash: b.tokensHash } : b),
);
const events = fc.array(fc.record({ parentHash: fc.option(u64, { nil: null }), blocks: fc.array(block, { maxLength: 40 }) }), { maxLength: 30 }).map((es) =>
  es.map((e, i): RouterEvent => ({ ...worker, eventId: i, ...e })),
);

/** The events as the JSON parser's typed batch holds them. */
function batchOf(es: RouterEvent[]): DumpBatch {
  const b = new DumpBatch(4);
  for (const e of es) {
    for (const k of e.blocks) {
      const hi = (h: bigint) => Number(h >> 32n), lo = (h: bigint) => Number(h & 0xffff_ffffn);
      b.pushBlock(hi(k.blockHash), lo(k.blockHash), hi(k.tokensHash), lo(k.tokensHash), k.copies ?? 1);
    }
    const p = e.parentHash ?? 0n;
    b.pushEvent(worker, e.eventId, e.parentHash !== null, Number(p >> 32n), Number(p & 0xffff_ffffn));
  }
  return b;
}

test("a run reads back as the events written into it, from objects or from a typed batch, byte for byte the same", () => {
  fc.assert(
    fc.property(events, (es) => {
      const fromObjects = new EventRunWriter();
      for (const e of es) fromObjects.event(e);
      const run = fromObjects.take().slice();
      const b = batchOf(es);
      const fromBatch = new EventRunWriter();
      for (let i = 0; i < b.count; i++) fromBatch.batchEvent(b, i);
      expect(Buffer.from(fromBatch.take()).equals(Buffer.from(run))).toBe(true);
      expect(runEvents(worker, run)).toEqual(es);
    }),
    { numRuns: 200, seed: 34 },
  );
});

test("the run is the binary dump's event layout: header flags and count, parent, hashes, then copies only when one is not 1", () => {
  const w = new EventRunWriter();
  w.event({ ...worker, eventId: 0, parentHash: null, blocks: [{ blockHash: 1n, tokensHash: 2n }] });
  w.event({ ...worker, eventId: 1, parentHash: 9n, blocks: [{ blockHash: 3n, tokensHash: 4n, copies: 0 }, { blockHash: 5n, tokensHash: 6n }] });
  const words = [...new BigUint64Array(w.take().slice().buffer)];
  const header = (flags: number, count: number) => BigInt(flags) | (BigInt(count) << 32n);
  const { hasParent, hasCopies } = DUMP_EVENT_FLAGS;
  expect(words).toEqual([header(0, 1), 1n, 2n, header(hasParent | hasCopies, 2), 9n, 3n, 5n, 4n, 6n, 0n, 1n]);
  expect(w.length).toBe(0); // take() starts the next run
});
