// A worker's blocks as dump rows (dump-layout.ts), parents first: what dump-json.ts and dump-binary.ts write.
import { ROW_BYTES, ROW_COPIES, ROW_FLAGS, ROW_HASH, ROW_HAS_PARENT, ROW_NEW_EVENT, ROW_PARENT, ROW_TOKENS } from "./dump-layout";
import { CHUNK_MASK, ID_MASK, ROOT, zeroed } from "./ids";
import { KIND_INLINE, NODE, highAt, inlineCopiesAt, isDead, kindAt, mix, nodeAt, nodeTop, parentOf, tokOf } from "./nodes";
import { alloc, free } from "./pages";
import { REC, recAt, resTop } from "./records";
import { ensureWorker, recsOfPtr, wCap } from "./workers";

// Dumps: a worker's records, gathered for a group of consecutive worker slots by one scan of the
// chunks (entries of 16 bytes: node u32 | copies u32, block hash u64, bucketed by slot). Valid while
// nothing changed the index (`epoch`); a dump that interleaves with live events gathers again.
const DUMP_GROUP_MAX: u32 = 1 << 18; // records per group (4 MiB)
export let epoch: u64 = 0; // bumped by every change (u64: never wraps back onto a gathered value)
let groupEpoch: u64 = u64.MAX_VALUE;
let groupLo: u32 = 0;
let groupHi: u32 = 0;
let groupBuf: usize = 0;
export let groupCap: u32 = 0; // entries
let groupStart: usize = 0; // u32 per slot of the group + 1: first entry
export let groupStartCap: u32 = 0;

function gather(w: u32): void {
  if (groupBuf != 0 && groupEpoch == epoch && w >= groupLo && w < groupHi) return;
  let total = load<u32>(recsOfPtr(w)), hi = w + 1;
  while (hi < wCap && total + load<u32>(recsOfPtr(hi)) <= DUMP_GROUP_MAX) total += load<u32>(recsOfPtr(hi++));
  if (total > groupCap) {
    if (groupBuf != 0) free(groupBuf, <usize>groupCap << 4);
    groupCap = max<u32>(total, 1024);
    groupBuf = alloc(<usize>groupCap << 4);
  }
  const slots = hi - w;
  if (slots + 1 > groupStartCap) {
    if (groupStart != 0) free(groupStart, <usize>groupStartCap << 2);
    groupStartCap = slots + 1;
    groupStart = alloc(<usize>groupStartCap << 2);
  }
  // offsets from the per-slot counts; then each scan places its entries at its slot's cursor
  let sum: u32 = 0;
  for (let s: u32 = 0; s < slots; s++) {
    store<u32>(groupStart + (<usize>s << 2), sum);
    sum += load<u32>(recsOfPtr(w + s));
  }
  store<u32>(groupStart + (<usize>slots << 2), sum);
  const cursor = alloc(<usize>slots << 2);
  memory.copy(cursor, groupStart, <usize>slots << 2);
  let p: usize = 0;
  for (let n: u32 = 2; n < nodeTop; n++) {
    if (p == 0 || (n & CHUNK_MASK) == 0) p = nodeAt(n);
    const e = p;
    p += NODE;
    if (isDead(e) || kindAt(e) != KIND_INLINE) continue;
    const s = highAt(e);
    if (s < w || s >= hi) continue;
    placeGathered(cursor, s - w, n, inlineCopiesAt(e), load<u64>(e, 8));
  }
  p = 0;
  for (let r: u32 = 1; r < resTop; r++) {
    if (p == 0 || (r & CHUNK_MASK) == 0) p = recAt(r);
    const e = p;
    p += REC;
    const packed = load<u64>(e, 8);
    const s = <u32>(packed >> 26) & 0xFFF;
    if (s < w || s >= hi) continue; // also skips free records (DEAD_WORKER)
    placeGathered(cursor, s - w, <u32>packed & ID_MASK, <u32>(packed >> 38), load<u64>(e));
  }
  free(cursor, <usize>slots << 2);
  groupLo = w;
  groupHi = hi;
  groupEpoch = epoch;
}

@inline function placeGathered(cursor: usize, s: u32, n: u32, copies: u32, ext: u64): void {
  const c = cursor + (<usize>s << 2);
  const at = load<u32>(c);
  store<u32>(c, at + 1);
  const g = groupBuf + (<usize>at << 4);
  store<u32>(g, n);
  store<u32>(g, copies, 4);
  store<u64>(g, ext, 8);
}

/** Frees the gathered group (KvIndex calls it when a dump ends; a running dump just gathers again). */
export function dumpCacheRelease(): void {
  if (groupBuf != 0) free(groupBuf, <usize>groupCap << 4);
  if (groupStart != 0) free(groupStart, <usize>groupStartCap << 2);
  groupBuf = 0; groupCap = 0; groupStart = 0; groupStartCap = 0;
  groupEpoch = u64.MAX_VALUE;
}

let dumpLen: u32 = 0;
export function dumpLength(): u32 { return dumpLen; }

const NONE: u32 = 0xFFFFFFFF;

/**
 * Copies the worker's blocks as 32-byte rows (see dump-json.ts) into a fresh buffer the caller frees
 * with release(ptr, max(len, 1) * 32): every block it holds and, with zero copies, the blocks on their
 * paths it no longer holds, depth-first so parents come first and a row whose parent is the row before
 * continues that row's event. Zero-copy records with no held block below are left out.
 */
export function dumpWorker(w: u32): usize {
  ensureWorker(w);
  gather(w);
  const first = load<u32>(groupStart + (<usize>(w - groupLo) << 2));
  const k = load<u32>(groupStart + (<usize>(w - groupLo + 1) << 2)) - first;
  const g = groupBuf + (<usize>first << 4);
  // node -> entry (open addressing, power of two)
  let cap: u32 = 16;
  while (cap < k * 2) cap <<= 1;
  const table = zeroed(<usize>cap << 3);
  for (let i: u32 = 0; i < k; i++) {
    const n = load<u32>(g + (<usize>i << 4));
    let j = <u32>mix(<u64>n) & (cap - 1);
    while (load<u64>(table + (<usize>j << 3)) != 0) j = (j + 1) & (cap - 1);
    store<u64>(table + (<usize>j << 3), <u64>n | (<u64>i << 32));
  }
  const words = max<u32>(k, 1);
  const parentIx = alloc(<usize>words << 2), needed = zeroed(<usize>words), kids = zeroed(<usize>(words + 1) << 2);
  for (let i: u32 = 0; i < k; i++) {
    const p = parentOf(load<u32>(g + (<usize>i << 4)));
    store<u32>(parentIx + (<usize>i << 2), p == ROOT ? NONE : entryOf(table, cap, p));
  }
  // needed: held entries and their ancestors (records are prefix-closed, so every ancestor has one)
  let rows: u32 = 0;
  for (let i: u32 = 0; i < k; i++) {
    if (load<u32>(g + (<usize>i << 4), 4) == 0) continue;
    let j = i;
    while (j != NONE && load<u8>(needed + <usize>j) == 0) {
      store<u8>(needed + <usize>j, 1);
      rows++;
      j = load<u32>(parentIx + (<usize>j << 2));
    }
  }
  // children of each needed entry, counting-sorted by parent (slot k stands for the root)
  for (let i: u32 = 0; i < k; i++) {
    if (load<u8>(needed + <usize>i) == 0) continue;
    const pi = load<u32>(parentIx + (<usize>i << 2));
    const c = kids + (<usize>(pi == NONE ? k : pi) << 2);
    store<u32>(c, load<u32>(c) + 1);
  }
  const kidStart = alloc(<usize>(words + 2) << 2), kidList = alloc(<usize>words << 2);
  let sum: u32 = 0;
  for (let i: u32 = 0; i <= k; i++) {
    store<u32>(kidStart + (<usize>i << 2), sum);
    sum += load<u32>(kids + (<usize>i << 2));
    store<u32>(kids + (<usize>i << 2), load<u32>(kidStart + (<usize>i << 2))); // cursor
  }
  store<u32>(kidStart + (<usize>(k + 1) << 2), sum);
  for (let i: u32 = 0; i < k; i++) {
    if (load<u8>(needed + <usize>i) == 0) continue;
    const pi = load<u32>(parentIx + (<usize>i << 2));
    const c = kids + (<usize>(pi == NONE ? k : pi) << 2);
    const at = load<u32>(c);
    store<u32>(c, at + 1);
    store<u32>(kidList + (<usize>at << 2), i);
  }
  // depth-first from the root's children; the stack holds entries still to visit
  const out = alloc(<usize>max<u32>(rows, 1) * ROW_BYTES);
  const stack = alloc(<usize>words << 2);
  let sp: u32 = 0;
  for (let c = load<u32>(kidStart + (<usize>(k + 1) << 2)); c > load<u32>(kidStart + (<usize>k << 2)); c--) {
    store<u32>(stack + (<usize>(sp++) << 2), load<u32>(kidList + (<usize>(c - 1) << 2)));
  }
  let o: u32 = 0;
  let last = NONE;
  while (sp > 0) {
    const i = load<u32>(stack + (<usize>(--sp) << 2));
    const e = g + (<usize>i << 4);
    const n = load<u32>(e);
    const pi = load<u32>(parentIx + (<usize>i << 2));
    const r = out + <usize>(o++) * ROW_BYTES;
    store<u64>(r, pi == NONE ? 0 : load<u64>(g + (<usize>pi << 4), 8), ROW_PARENT);
    store<u64>(r, load<u64>(e, 8), ROW_HASH);
    store<u64>(r, tokOf(n), ROW_TOKENS);
    store<u32>(r, (pi == last && pi != NONE ? 0 : ROW_NEW_EVENT) | (pi == NONE ? 0 : ROW_HAS_PARENT), ROW_FLAGS);
    store<u32>(r, load<u32>(e, 4), ROW_COPIES);
    last = i;
    for (let c = load<u32>(kidStart + (<usize>(i + 1) << 2)); c > load<u32>(kidStart + (<usize>i << 2)); c--) {
      store<u32>(stack + (<usize>(sp++) << 2), load<u32>(kidList + (<usize>(c - 1) << 2)));
    }
  }
  free(table, <usize>cap << 3);
  free(parentIx, <usize>words << 2);
  free(needed, <usize>words);
  free(kids, <usize>(words + 1) << 2);
  free(kidStart, <usize>(words + 2) << 2);
  free(kidList, <usize>words << 2);
  free(stack, <usize>words << 2);
  dumpLen = rows;
  return out;
}

function entryOf(table: usize, cap: u32, n: u32): u32 {
  let j = <u32>mix(<u64>n) & (cap - 1);
  while (true) {
    const e = load<u64>(table + (<usize>j << 3));
    if (e == 0) return NONE; // cannot happen (records are prefix-closed); the row then starts at the root
    if (<u32>e == n) return <u32>(e >> 32);
    j = (j + 1) & (cap - 1);
  }
}
