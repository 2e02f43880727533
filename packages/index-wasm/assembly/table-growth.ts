// Growing the tables: an insert past the load limit, presizing, reserving for a pool's capacity, and the
// rebuild that grows or sweeps a table.
import { CHUNK, CHUNK_MASK, EMPTY, MAX_NODE_ID, MAX_REC_ID, RES_INLINE } from "./ids";
import { KIND_INLINE, NODE, growNodes, highAt, isDead, kindAt, nodeAt, nodeCap, nodeTop } from "./nodes";
import { alloc, allocZeroed, ensureFreeRun, free, pagesFor, usable } from "./pages";
import { DEAD_WORKER, REC, growRes, recAt, resCap, resTop } from "./records";
import { CHILD, MIN_TABLE, RES, capOf, childMissAt, childMissTomb, countOf, homeOf, keyHash, nextSlot, resMissAt, resMissHash, resMissTomb, setCount, setTombs, slotsOf, tableInit, tagOf, tombsOf } from "./tables";

// Growth rule (see tableRebuild): a table grows past MAX_LOAD_NUM / MAX_LOAD_DEN load (80%) to
// GROW_NUM / GROW_DEN (2.2x) its entries.
const MAX_LOAD_NUM: u32 = 20;
const MAX_LOAD_DEN: u32 = 25;
const GROW_NUM: u32 = 22;
const GROW_DEN: u32 = 10;
@inline function overMaxLoad(entries: u32, cap: u32): bool { return entries * MAX_LOAD_DEN > cap * MAX_LOAD_NUM; }
@inline function tableFull(t: i32): bool { return overMaxLoad(countOf(t) + tombsOf(t) + 1, capOf(t)); }

/** Indexes an entry already written to its chunk, whose key the table's last find just missed. */
@inline function insertAfterMiss(t: i32, v: u32, h: u64): void {
  if (tableFull(t)) tableRebuild(t, countOf(t) + 1); // the rebuild picks the entry up from its chunk
  else {
    const at = t == RES ? resMissAt : childMissAt;
    store<u32>(slotsOf(t) + (<usize>at << 2), v);
    if (t == RES ? resMissTomb : childMissTomb) setTombs(t, tombsOf(t) - 1);
  }
  setCount(t, countOf(t) + 1);
}
@inline export function childInsertAfterMiss(id: u32, seq: u64): void { insertAfterMiss(CHILD, id | tagOf(CHILD, seq), seq); }
@inline export function resInsertAfterMiss(v: u32): void { insertAfterMiss(RES, v | tagOf(RES, resMissHash), resMissHash); }

/**
 * Grows the arrays and tables up front for an expected number of blocks and residencies, so a large
 * initial load (a recovery dump, a benchmark) does not pay for repeated doubling and rehashing.
 */
export function presize(blocksWanted: u32, residenciesWanted: u32): void {
  // as far as the id limits go (beyond them the index traps when it really gets there)
  while (nodeCap < blocksWanted + 2 && nodeCap + CHUNK - 1 <= MAX_NODE_ID) growNodes();
  // records hold the residencies of blocks with several holders (a block's only holder is inline)
  const shared = residenciesWanted > blocksWanted ? residenciesWanted : 0;
  while (resCap < shared + 1 && resCap + CHUNK - 1 <= MAX_REC_ID) growRes();
  tableReserve(CHILD, blocksWanted);
  tableReserve(RES, residenciesWanted);
}

function tableReserve(t: i32, entries: u32): void {
  if (overMaxLoad(entries, capOf(t))) tableRebuild(t, entries);
}

/**
 * Grows both tables, where smaller, so that `residencies` residencies and as many distinct blocks fit
 * at no more than 5/8 load: a pool whose caches fill up to their announced size then never rebuilds a
 * table on the way (each growth re-places every entry and stops ingestion for as long). A table rebuilt
 * while it holds about that (a sweep of the tombstones churn leaves, at 80% with them) keeps its
 * capacity (withinReservation), so a full pool's churn does not undo it. 5/8 rather than the 45% a growth
 * restarts at: at full caches the tables then cost 12.8 B per unshared residency (36.8 B in all,
 * within the 40 B the growing tables keep to), and the probes of the last inserts stay short. Only the
 * tables: node and record chunks grow without copying. Never shrinks. The memory is made sure of
 * first: false, with the index unchanged, if the host refuses to grow it (never a trap halfway).
 */
export function reserveTables(residencies: u32): bool {
  const entries = min<u32>(residencies, MAX_NODE_ID);
  const cap = max<u32>(MIN_TABLE, <u32>(<u64>entries * 8 / 5));
  // the rebuild rounds the table up to whole pages, and its buckets follow the rounded size
  const slots = wholeTableSlots(cap);
  let pages: u32 = 0;
  for (let t: i32 = 0; t < 2; t++) if (capOf(t) < cap) pages += pagesFor(<usize>slots << 2) + rebuildScratchPages(slots);
  if (pages > 0 && !ensureFreeRun(pages)) return false;
  if (entries > reservedEntries) reservedEntries = entries;
  if (capOf(CHILD) < cap) tableRebuildTo(CHILD, cap);
  if (capOf(RES) < cap) tableRebuildTo(RES, cap);
  return true;
}

// Rebuild sources: CHILD from the nodes; RES from the shared records, then the nodes' inline holders.
// Each source is read in id order in its own tight loop (measured: one call per entry made rebuilds a
// visible share of ingestion); every entry goes straight to rbEmit.
let rbSlots: usize = 0; // the table being filled
let rbCap: u32 = 0;
let rbShift: u32 = 0; // bucket = home >> rbShift; 32: no buckets, entries are placed as they come
let rbBuckets: usize = 0; // REBUILD_BUCKET_CAP (value << 32 | home) pairs per bucket
let rbFill: usize = 0; // u32 per bucket: pairs held

/** Stores v in the first empty slot from i on, in a table being rebuilt (no tombstones). */
@inline function placeFrom(slots: usize, cap: u32, i: u32, v: u32): void {
  while (load<u32>(slots + (<usize>i << 2)) != EMPTY) i = nextSlot(i, cap);
  store<u32>(slots + (<usize>i << 2), v);
}

/** An entry for the table being rebuilt: held in its home's bucket, which is placed when full. */
@inline function rbEmit(v: u32, home: u32): void {
  if (rbShift == 32) { placeFrom(rbSlots, rbCap, home, v); return; }
  const b = home >> rbShift;
  const f = rbFill + (<usize>b << 2);
  const n = load<u32>(f);
  store<u64>(rbBuckets + ((<usize>b * REBUILD_BUCKET_CAP + n) << 3), (<u64>v << 32) | <u64>home);
  if (n + 1 < REBUILD_BUCKET_CAP) store<u32>(f, n + 1);
  else {
    rbFlush(b, REBUILD_BUCKET_CAP);
    store<u32>(f, 0);
  }
}

/** Places the first `n` pairs of bucket b: all of them land in the same ~1/4096 of the table. */
function rbFlush(b: u32, n: u32): void {
  const slots = rbSlots, cap = rbCap;
  const q = rbBuckets + ((<usize>b * REBUILD_BUCKET_CAP) << 3);
  for (let j: u32 = 0; j < n; j++) {
    const v = load<u64>(q + (<usize>j << 3));
    placeFrom(slots, cap, <u32>v, <u32>(v >> 32));
  }
}

/** Emits every live entry of table t (see rbEmit). */
function rbEmitAll(t: i32): void {
  const cap = rbCap;
  if (t == RES) {
    let p: usize = 0;
    for (let id: u32 = 1; id < resTop; id++) {
      if (p == 0 || (id & CHUNK_MASK) == 0) p = recAt(id);
      const e = p;
      p += REC;
      const w = <u32>(load<u64>(e, 8) >> 26) & 0xFFF;
      if (w == DEAD_WORKER) continue;
      const h = keyHash(w, load<u64>(e));
      rbEmit(id | tagOf(RES, h), homeOf(h, cap));
    }
  }
  let p: usize = 0;
  for (let id: u32 = 2; id < nodeTop; id++) {
    if (p == 0 || (id & CHUNK_MASK) == 0) p = nodeAt(id);
    const e = p;
    p += NODE;
    if (isDead(e)) continue;
    if (t == CHILD) {
      const h = load<u64>(e);
      rbEmit(id | tagOf(CHILD, h), homeOf(h, cap));
    } else if (kindAt(e) == KIND_INLINE) {
      const h = keyHash(highAt(e), load<u64>(e, 8));
      rbEmit(id | RES_INLINE | tagOf(RES, h), homeOf(h, cap));
    }
  }
}

/**
 * Rebuilds a table (dropping tombstones). It keeps its capacity while that leaves `entries` under 60%
 * load (at least a fifth of the table then absorbs tombstones before the next rebuild: steady churn
 * keeps its footprint), else grows to 2.2x `entries` (a table grown at 80% load restarts at 45%). The
 * rule before was 80% -> 2x. A replay of rules over table sizes (each table alone, caps rounded to
 * pages as here; final sizes 0.5M-2M) compared them, per final entry: re-placements 1.64 on average
 * against 2.01 (2.13M against 2.77M for the ingestion bench); unshared bytes per residency (24-byte
 * nodes, both tables) 37.2 on average against 36.9, 41.8 at worst against 40.3 (just after both tables
 * grew); mean unsuccessful-search length over a table's life ~4.7 slots against 5.2. At the memory
 * bench's 1M residencies both give 35.5 B unshared (measured: 37 B of linear memory, was 37.5) and
 * 25.7 B shared (26.9 B linear, was 27). Measured in the module (bench/module-ab.ts, same process):
 * 80% -> 2.2x against 84% -> 2.1x (which the replay rates at 1.63 re-placements, 36.5 / 41.0 B, 5.9
 * slots) into an empty index, thread CPU min 103.4 / 125.9 ms against 123.7 / 149.4 in two runs: the
 * shorter probes count more than the extra 5% of re-placements. Growing to 2.5x the entries (the
 * doubling used before 80% -> 2x) re-places ~1.3 per entry but reaches 44 B per residency right after
 * growing (41 B unshared at 1M). Entries are re-placed from the node/record chunks in id order rather
 * than from the old slots (sequential key reads; measured: re-placing from the old slots,
 * one dependent cache miss per entry, took 35 ms for 504k entries against 5.5 ms), and, for big tables,
 * through buckets by home slot: the home is a multiply-shift, so a bucket's entries all land in one
 * small stretch of the table, placed together when the bucket is full (measured: placing entries at
 * random was about a third of the cost of ingesting 1M block events into an empty index). The buckets
 * replace sorting batches of entries by home (a histogram pass, a scatter pass and a pairs array).
 */
function tableRebuild(t: i32, entries: u32): void {
  let cap = capOf(t);
  if (entries * 5 > cap * 3 && !withinReservation(entries)) cap = max<u32>(MIN_TABLE, entries * GROW_NUM / GROW_DEN);
  tableRebuildTo(t, cap);
}

let rebuilds: u32 = 0;
/** Entries the tables were reserved for (reserveTables). */
let reservedEntries: u32 = 0;
/**
 * A rebuild of a reserved table keeps its capacity up to 1/8 past the reservation (at most ~70% load
 * after the sweep, so tombstones still have room): a full pool's transient overshoot (a store applied
 * before the removal that made room for it) is not a growth.
 */
@inline function withinReservation(entries: u32): bool { return entries <= reservedEntries + (reservedEntries >> 3); }
export function tableRebuilds(): u32 { return rebuilds; }

/** Rebuilds table t with (at least) `cap` slots from the chunks (see tableRebuild). */
function tableRebuildTo(t: i32, cap: u32): void {
  rebuilds++;
  free(slotsOf(t), <usize>capOf(t) << 2);
  cap = wholeTableSlots(cap);
  tableInit(t, cap);
  rbSlots = slotsOf(t);
  rbCap = cap;
  if (cap < BUCKETED_REBUILD_MIN) {
    rbShift = 32;
    rbEmitAll(t);
    return;
  }
  // buckets of ~256 slots (at most REBUILD_BUCKETS of them): scratch in proportion to the table
  const ceilLog: u32 = 32 - <u32>clz<u32>(cap - 1);
  const bits = rebuildBucketBits(cap);
  const buckets: u32 = 1 << bits;
  rbShift = ceilLog - bits;
  const bucketBytes = rebuildBucketBytes(buckets);
  rbBuckets = alloc(bucketBytes);
  rbFill = allocZeroed(<usize>buckets << 2);
  rbEmitAll(t);
  for (let b: u32 = 0; b < buckets; b++) rbFlush(b, load<u32>(rbFill + (<usize>b << 2)));
  free(rbBuckets, bucketBytes);
  free(rbFill, <usize>buckets << 2);
}

/** log2 of the buckets a rebuild into `cap` slots uses (tables of BUCKETED_REBUILD_MIN slots or more). */
function rebuildBucketBits(cap: u32): u32 { return min<u32>(REBUILD_BUCKET_BITS, (32 - <u32>clz<u32>(cap - 1)) - 8); }

@inline function rebuildBucketBytes(buckets: u32): usize { return (<usize>buckets * REBUILD_BUCKET_CAP) << 3; }

/** Pages a rebuild into `cap` slots takes besides the table: its buckets and their fill counts. */
function rebuildScratchPages(cap: u32): u32 {
  if (cap < BUCKETED_REBUILD_MIN) return 0;
  const buckets: u32 = 1 << rebuildBucketBits(cap);
  return pagesFor(rebuildBucketBytes(buckets)) + pagesFor(<usize>buckets << 2);
}

/** The slots a table of at least `cap` gets: a table in whole pages uses all of them. */
@inline function wholeTableSlots(cap: u32): u32 { return <u32>(usable(<usize>cap << 2) >> 2); }

const BUCKETED_REBUILD_MIN: u32 = 1 << 16;
const REBUILD_BUCKET_BITS: u32 = 12;
const REBUILD_BUCKET_CAP: u32 = 64; // pairs: 2 MiB of buckets at most
