// Random indexes for the dump tests: a few workers (ids needing JSON escapes among them) storing chains
// under earlier blocks, some blocks stored again (a second copy) or removed (kept with zero copies while
// they have children), so every kind of dump row appears.
import fc from "fast-check";
import { KvIndex } from "../src/index.ts";
import { applyRemoved, applyStored } from "../src/helpers.ts";

const U64_MAX = 0xffff_ffff_ffff_ffffn;
export const DIGIT_EDGES = [0n, 9n, 10n, 99_999_999n, 100_000_000n, 10n ** 16n, 10n ** 19n, U64_MAX];

export type RandomEvent = { w: number; parent: number; blocks: { e: bigint; t: bigint }[]; remove: number };

export function randomEvents(u64: fc.Arbitrary<bigint> = fc.oneof(fc.bigInt({ min: 0n, max: U64_MAX }), fc.constantFrom(...DIGIT_EDGES))): fc.Arbitrary<RandomEvent[]> {
  return fc.array(fc.record({ w: fc.nat(3), parent: fc.nat(20), blocks: fc.array(fc.record({ e: u64, t: u64 }), { minLength: 1, maxLength: 6 }), remove: fc.nat(5) }), { maxLength: 25 });
}

/** Into `index` when given (an emptied one reused across runs: see `emptied`), else a fresh one. */
export function randomIndex(events: RandomEvent[], index = KvIndex.create({ blockSize: 16 })): KvIndex {
  const workers = [{ workerId: "a", dpRank: 0 }, { workerId: "é\"\\\n", dpRank: 7 }, { workerId: "", dpRank: 1 }, { workerId: "a", dpRank: 1 }];
  const held: bigint[][] = [[], [], [], []];
  for (const ev of events) {
    const mine = held[ev.w]!;
    const parent = mine.length > 0 && ev.parent % 3 !== 0 ? mine[ev.parent % mine.length]! : null;
    if (applyStored(index, workers[ev.w]!, parent, ev.blocks.map((b) => ({ blockHash: b.e, tokensHash: b.t }))).kind === "applied") {
      for (const b of ev.blocks) mine.push(b.e);
    }
    if (ev.remove === 1 && mine.length > 0) applyRemoved(index, workers[ev.w]!, [mine[ev.parent % mine.length]!]);
    if (ev.remove === 2 && ev.blocks.length > 0) applyStored(index, workers[ev.w]!, parent, ev.blocks.slice(0, 1).map((b) => ({ blockHash: b.e, tokensHash: b.t })));
  }
  return index;
}

/**
 * `index` with every worker removed, for the next run of a property: each KvIndex is a WebAssembly
 * instance with its own linear memory, which JSC reclaims only by a full collection, forced every few
 * instantiations; beside the whole suite's heap, hundreds of fresh indexes cost tens of seconds.
 */
export function emptied(index: KvIndex): KvIndex {
  for (const w of index.workers()) index.removeWorker(w);
  if (index.stats().residencies !== 0) throw new Error("an emptied index still holds residencies");
  return index;
}
