// The two hash tables every lookup goes through (CHILD and RES): find, insert after a miss, delete.
// Their growth and rebuild are in table-growth.ts.
import { EMPTY, ID_BITS, ID_MASK, NIL, RES_ID_MASK, RES_INLINE, zeroed } from "./ids";
import { highAt, mix, nodeAt } from "./nodes";
import { free } from "./pages";
import { recAt, recNode, recWorker } from "./records";

// Two open-addressing tables (linear probing): CHILD maps (parent node, sequence hash) -> node,
// RES maps (worker, block hash) -> the record: a node id with RES_INLINE set (its inline holder) or a
// shared record id. A slot is a u32: id in the low 26 bits (in RES: the inline flag and a 25-bit id),
// 6 hash tag bits above, so probing past foreign entries rarely dereferences them (RES had 5 and a
// 26-bit id: on the ingestion bench 115k of its 391k record reads were other keys with the same tag;
// with 6, 57k of 334k). Deletion leaves a tombstone; tombstones are reused by inserts and swept by a rebuild, which scans the
// node/record chunks sequentially. Capacities are not powers of two (the home slot is a multiply-shift
// of the low 32 hash bits).
export const CHILD: i32 = 0;
export const RES: i32 = 1;
const TOMB: u32 = 0xFFFFFFFF;
const TABLES: usize = memory.data(32, 8); // per table: slots ptr u32 | cap u32 | count u32 | tombstones u32
export const MIN_TABLE: u32 = 1024;

@inline export function slotsOf(t: i32): usize { return <usize>load<u32>(TABLES + (<usize>t << 4)); }
@inline export function capOf(t: i32): u32 { return load<u32>(TABLES + (<usize>t << 4), 4); }
@inline export function countOf(t: i32): u32 { return load<u32>(TABLES + (<usize>t << 4), 8); }
@inline export function setCount(t: i32, v: u32): void { store<u32>(TABLES + (<usize>t << 4), v, 8); }
@inline export function tombsOf(t: i32): u32 { return load<u32>(TABLES + (<usize>t << 4), 12); }
@inline export function setTombs(t: i32, v: u32): void { store<u32>(TABLES + (<usize>t << 4), v, 12); }

@inline export function keyHash(a: u32, b: u64): u64 { return mix(b ^ (<u64>(a + 1) * 0x9E3779B97F4A7C15)); }
@inline export function tagOf(t: i32, h: u64): u32 { return <u32>(h >> 58) << ID_BITS; } // the same for both tables
/** Home slot: multiply-shift of the low 32 bits (the tag uses the top bits, so they stay independent). */
@inline export function homeOf(h: u64, cap: u32): u32 { return <u32>((<u64><u32>h * <u64>cap) >> 32); }
@inline export function nextSlot(i: u32, cap: u32): u32 { const j = i + 1; return select<u32>(0, j, j == cap); }

/** A RES value's block hash, worker and node. */
@inline export function resId(v: u32): u32 { return v & RES_ID_MASK; }
@inline function resExt(v: u32): u64 { return (v & RES_INLINE) ? load<u64>(nodeAt(resId(v)), 8) : load<u64>(recAt(resId(v))); }
@inline function resWorker(v: u32): u32 { return (v & RES_INLINE) ? highAt(nodeAt(resId(v))) : recWorker(resId(v)); }
@inline export function resNode(v: u32): u32 { return (v & RES_INLINE) ? resId(v) : recNode(resId(v)); }

// First empty or tombstone slot seen by the last missed find of each table (and the RES key's hash):
// inserts fill it without probing again.
export let resMissAt: u32 = 0;
export let resMissTomb: bool = false;
export let resMissHash: u64 = 0;
export let childMissAt: u32 = 0;
export let childMissTomb: bool = false;
let foundAt: u32 = 0; // slot of the last RES hit

/** The RES value of (w, ext): a node id | RES_INLINE, or a record id; NIL when absent. */
@inline export function resFind(w: u32, ext: u64): u32 { return resFindHashed(w, ext, keyHash(w, ext)); }

/** resFind with the key's hash (keyHash(w, ext)) already computed. */
@inline export function resFindHashed(w: u32, ext: u64, h: u64): u32 {
  const slots = slotsOf(RES), cap = capOf(RES);
  const tag = tagOf(RES, h);
  let i = homeOf(h, cap);
  let free: u32 = 0xFFFFFFFF;
  while (true) {
    const v = load<u32>(slots + (<usize>i << 2));
    if (v == EMPTY) break;
    if (v == TOMB) {
      if (free == 0xFFFFFFFF) free = i;
    } else if ((v & ~ID_MASK) == tag && resExt(v) == ext && resWorker(v) == w) {
      foundAt = i;
      return v;
    }
    i = nextSlot(i, cap);
  }
  resMissTomb = free != 0xFFFFFFFF;
  resMissAt = resMissTomb ? free : i;
  resMissHash = h;
  return NIL;
}

/** The child of `parent` with sequence hash `seq`, or NIL. */
@inline export function childFind(parent: u32, seq: u64): u32 {
  const slots = slotsOf(CHILD), cap = capOf(CHILD);
  const tag = tagOf(CHILD, seq);
  let i = homeOf(seq, cap);
  let free: u32 = 0xFFFFFFFF;
  while (true) {
    const v = load<u32>(slots + (<usize>i << 2));
    if (v == EMPTY) break;
    if (v == TOMB) {
      if (free == 0xFFFFFFFF) free = i;
    } else if ((v & ~ID_MASK) == tag) {
      const p = nodeAt(v & ID_MASK);
      if (load<u64>(p) == seq && (load<u32>(p, 16) & ID_MASK) == parent) return v & ID_MASK;
    }
    i = nextSlot(i, cap);
  }
  childMissTomb = free != 0xFFFFFFFF;
  childMissAt = childMissTomb ? free : i;
  return NIL;
}

/**
 * childFind for a parent created in this same event, which has no children yet: only the slot an insert
 * would take is looked for, so no probed entry's node is read (a tag match is a cache miss).
 */
@inline export function childMissUnderNew(seq: u64): void {
  const slots = slotsOf(CHILD), cap = capOf(CHILD);
  let i = homeOf(seq, cap);
  let v = load<u32>(slots + (<usize>i << 2));
  while (v != EMPTY && v != TOMB) {
    i = nextSlot(i, cap);
    v = load<u32>(slots + (<usize>i << 2));
  }
  childMissTomb = v == TOMB;
  childMissAt = i;
}

export function tableInit(t: i32, cap: u32): void {
  store<u32>(TABLES + (<usize>t << 4), <u32>zeroed(<usize>cap << 2));
  store<u32>(TABLES + (<usize>t << 4), cap, 4);
  setTombs(t, 0);
}

/** Deletes the entry whose slot value (less its tag) is `v` and whose key hashes to h. */
export function tableDeleteAt(t: i32, v: u32, h: u64): void {
  const slots = slotsOf(t), cap = capOf(t);
  const want = v | tagOf(t, h);
  let i = homeOf(h, cap);
  if (t == RES && load<u32>(slots + (<usize>foundAt << 2)) == want) i = foundAt; // the last hit: no probe
  else while (load<u32>(slots + (<usize>i << 2)) != want) i = nextSlot(i, cap);
  store<u32>(slots + (<usize>i << 2), TOMB);
  setCount(t, countOf(t) - 1);
  setTombs(t, tombsOf(t) + 1);
}

/** Points the RES entry of (w, ext), now `from`, at `to` (same key, so same slot and tag). */
export function resRepoint(w: u32, ext: u64, from: u32, to: u32): void {
  const slots = slotsOf(RES), cap = capOf(RES);
  const h = keyHash(w, ext), tag = tagOf(RES, h);
  let i = homeOf(h, cap);
  while (load<u32>(slots + (<usize>i << 2)) != (from | tag)) i = nextSlot(i, cap);
  store<u32>(slots + (<usize>i << 2), to | tag);
}
