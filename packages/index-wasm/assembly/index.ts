// The KV index over linear memory. See ../README.md for the layout and why it looks like this.
//
// Sequence identity: a node is (parent node, tokens hash); node 1 is the root (the empty prefix).
// Each node stores a 64-bit sequence hash seq = mixBijective(tokens hash ^ spread(parent's seq)) and the
// child table is keyed by it. A query can then compute every level's table address from the tokens
// alone, so the CPU overlaps the cache misses of successive levels instead of chaining them (the
// parent id is still compared, so matching stays exact); and the mix is a bijection, so the tokens
// hash is recovered from (seq, parent seq) for dumps instead of being stored twice.
//
// Records: a worker's (block hash, copies) at a node. copies >= 1: the worker holds the block (a
// residency). copies == 0: it does not any more, but the block has children: vLLM keeps a child whose
// parent was evicted (its hash is unchanged), so the record stays to name the prefix (dumps, a later
// re-store) while the node has children. Invariants: a worker with a record at a node has one at its
// parent (records are prefix-closed per worker); a node lives while it has records or children; a
// zero-copy record lives only while its node has children. Matching counts a worker's leading blocks
// held (at least one copy each), so a hit walk stops at the first block it lost.
//
// A node with one worker's record holds it inline (no record, no list); a second worker moves both
// into 16-byte shared records and the node's payload becomes the worker mask for matching.
import { xxh3 } from "./xxh3";
import { alloc, allocZeroed, ensureFreeRun, free, freePages, pagesFor, regrow, usable } from "./pages";
import { initJson } from "./dump-json";
import { ROW_BYTES, ROW_COPIES, ROW_FLAGS, ROW_HAS_PARENT, ROW_HASH, ROW_NEW_EVENT, ROW_PARENT, ROW_TOKENS } from "./dump-layout";
export { dumpJson } from "./dump-json";
export { dumpBinary, dumpBinaryEnd, dumpBinaryNeed } from "./dump-binary";

const NIL: u32 = 0;
const DEAD: u32 = 0xFFFFFFFF;
const ROOT: u32 = 1;
const EMPTY: u32 = 0;

@inline function grow(ptr: usize, oldBytes: usize, newBytes: usize): usize { return regrow(ptr, oldBytes, newBytes); }
@inline function zeroed(bytes: usize): usize { return allocZeroed(bytes); }

// Table slots hold 26-bit ids (6 tag bits above). In RES the id's top bit tells a node (its inline
// holder) from a shared record, so both have 25-bit ids: an index holds fewer than 2^25 - 8192 blocks
// and 2^25 shared records.
const ID_BITS: u32 = 26;
const ID_MASK: u32 = (1 << ID_BITS) - 1;
const RES_INLINE: u32 = 1 << (ID_BITS - 1);
const RES_ID_MASK: u32 = RES_INLINE - 1;
const MAX_NODE_ID: u32 = RES_ID_MASK - 1; // RES_ID_MASK | RES_INLINE with all tag bits is the tombstone
const MAX_REC_ID: u32 = RES_ID_MASK;

// ---- chunked arrays: nodes and records live in fixed chunks of 8192 (whole pages: 192 KiB of nodes,
// 128 KiB of records) behind a directory holding each chunk's first page as a u16. Chunks never move,
// growth is one chunk at a time, and chunks fill the runs freed tables leave (measured: arrays that
// doubled through realloc left their old copies in linear memory, ~2x the live structures).
const CHUNK_BITS: u32 = 13;
const CHUNK: u32 = 1 << CHUNK_BITS;
const CHUNK_MASK: u32 = CHUNK - 1;
const DIR_BYTES: usize = (<usize>1 << (ID_BITS - CHUNK_BITS)) << 1;

// ---- nodes: 24-byte structs ----
// 0 sequence hash u64 | 8 payload u64: the inline holder's block hash, or the worker mask of slots
// 0..63 (held, shared nodes) | 16 u32: parent (26 bits) | kind << 26 (2 bits) | inline copies << 28 (4 bits)
// | 20 u32: child count (20 bits) | inline holder's slot, or the shared node's record count, << 20.
// A free node has DEAD at 16 and the free-list link at 8. Mask words for slots >= 64 live in nMaskExt.
const NODE: usize = 24;
const KIND_NONE: u32 = 0;
const KIND_INLINE: u32 = 1;
const KIND_SHARED: u32 = 2;
const INLINE_MAX_COPIES: u32 = 15;
const CHILD_BITS: u32 = 20;
const CHILD_MAX: u32 = (1 << CHILD_BITS) - 1; // sticky: a node with this many children is never freed
let nodeCap: u32 = 0;
let nodeTop: u32 = 2;
let nodeFree: u32 = NIL;
let nodesLive: u32 = 0;
let nodeDir: usize = 0;
let maskWords: u32 = 1;  // 64-slot words per node; words past the first live in nMaskExt
let nMaskExt: usize = 0; // u64 x (maskWords - 1) per node, for extCap nodes (rare: > 64 workers)
let extCap: u32 = 0;

@inline function nodeAt(n: u32): usize {
  return (<usize>load<u16>(nodeDir + (<usize>(n >> CHUNK_BITS) << 1)) << 16) + <usize>(n & CHUNK_MASK) * NODE;
}
@inline function seqOf(n: u32): u64 { return load<u64>(nodeAt(n)); }
@inline function parentOf(n: u32): u32 { return load<u32>(nodeAt(n), 16) & ID_MASK; }
@inline function kindAt(p: usize): u32 { return (load<u32>(p, 16) >> 26) & 3; }
@inline function inlineCopiesAt(p: usize): u32 { return load<u32>(p, 16) >> 28; }
@inline function childCountAt(p: usize): u32 { return load<u32>(p, 20) & CHILD_MAX; }
@inline function highAt(p: usize): u32 { return load<u32>(p, 20) >> CHILD_BITS; } // inline slot / shared record count
@inline function setKindCopies(p: usize, kind: u32, copies: u32): void {
  store<u32>(p, (load<u32>(p, 16) & ID_MASK) | (kind << 26) | (copies << 28), 16);
}
@inline function setHigh(p: usize, v: u32): void { store<u32>(p, (load<u32>(p, 20) & CHILD_MAX) | (v << CHILD_BITS), 20); }
@inline function isDead(p: usize): bool { return load<u32>(p, 16) == DEAD; }

const ROOT_SEQ: u64 = 0x243F6A8885A308D3;
const MIX_MUL: u64 = 0xD6E8FEB86659FD93;
const MIX_MUL_INVERSE: u64 = 0xCFEE444D8B59A89B; // MIX_MUL * this == 1 (mod 2^64)
@inline function spread(parentSeq: u64): u64 { return rotl<u64>(parentSeq, 23) * 0x9E3779B97F4A7C15; }
@inline function mix(h: u64): u64 {
  h ^= h >> 32;
  h *= MIX_MUL;
  return h ^ (h >> 32);
}
@inline function unmix(h: u64): u64 {
  h ^= h >> 32;
  h *= MIX_MUL_INVERSE;
  return h ^ (h >> 32);
}
@inline function childSeq(parentSeq: u64, tok: u64): u64 { return mix(tok ^ spread(parentSeq)); }
function tokOf(n: u32): u64 { return unmix(seqOf(n)) ^ spread(seqOf(parentOf(n))); }

@inline function maskExtAt(n: u32, word: u32): usize {
  return nMaskExt + ((<usize>n * (maskWords - 1) + word - 1) << 3);
}

/** Word 0 of the node's held-worker mask (slots 0..63). */
@inline function mask0At(p: usize): u64 {
  const kind = kindAt(p);
  if (kind == KIND_SHARED) return load<u64>(p, 8);
  const s = highAt(p);
  return select<u64>(<u64>1 << (<u64>(s & 63)), 0, kind == KIND_INLINE && s < 64 && inlineCopiesAt(p) != 0);
}

@inline function maskWord(n: u32, word: u32): u64 { return word == 0 ? mask0At(nodeAt(n)) : load<u64>(maskExtAt(n, word)); }

/** Whether worker w holds the node (at least one copy). */
function holds(n: u32, w: u32): bool { return ((maskWord(n, w >> 6) >> (<u64>(w & 63))) & 1) != 0; }

/** Marks w as holding the node or not in the mask (the inline holder of slot < 64 is implied by its copies). */
function setHeldBit(n: u32, w: u32, on: bool): void {
  const bit = <u64>1 << (<u64>(w & 63));
  let mp: usize;
  if (w >= 64) mp = maskExtAt(n, w >> 6);
  else {
    const p = nodeAt(n);
    if (kindAt(p) != KIND_SHARED) return;
    mp = p + 8;
  }
  store<u64>(mp, on ? load<u64>(mp) | bit : load<u64>(mp) & ~bit);
}

function growNodes(): void {
  if (nodeCap + CHUNK - 1 > MAX_NODE_ID) unreachable(); // RES slots hold 25-bit node ids
  store<u16>(nodeDir + (<usize>(nodeCap >> CHUNK_BITS) << 1), <u16>(alloc(<usize>CHUNK * NODE) >> 16));
  nodeCap += CHUNK;
  if (maskWords > 1 && nodeCap > extCap) growMaskExt(nodeCap * 2);
}

function growMaskExt(cap: u32): void {
  const stride = <usize>(maskWords - 1) << 3;
  nMaskExt = grow(nMaskExt, <usize>extCap * stride, <usize>cap * stride);
  extCap = cap;
}

/** A new child of `parent` without records; childFind(parent, seq) has just missed (its probe found the slot). */
function newNode(parent: u32, seq: u64): u32 {
  let id: u32;
  if (nodeFree != NIL) {
    id = nodeFree;
    nodeFree = load<u32>(nodeAt(id), 8);
  } else {
    if (nodeTop == nodeCap) growNodes();
    id = nodeTop++;
  }
  const p = nodeAt(id), pp = nodeAt(parent);
  store<u64>(p, seq);
  store<u64>(p, 0, 8);
  store<u32>(p, parent, 16);
  store<u32>(p, 0, 20);
  if (maskWords > 1) memory.fill(maskExtAt(id, 1), 0, <usize>(maskWords - 1) << 3);
  const c = load<u32>(pp, 20);
  if ((c & CHILD_MAX) != CHILD_MAX) store<u32>(pp, c + 1, 20);
  childInsertAfterMiss(id, seq);
  nodesLive++;
  return id;
}

/** Frees a node with neither records nor children; returns its parent (which lost a child). */
function freeNode(id: u32): u32 {
  const p = nodeAt(id);
  const parent = load<u32>(p, 16) & ID_MASK;
  tableDeleteAt(CHILD, id, load<u64>(p));
  store<u32>(p, DEAD, 16); // marks the slot free for table rebuilds
  store<u64>(p, <u64>nodeFree, 8);
  nodeFree = id;
  nodesLive--;
  const pp = nodeAt(parent);
  const c = load<u32>(pp, 20);
  if ((c & CHILD_MAX) != CHILD_MAX) store<u32>(pp, c - 1, 20);
  return parent;
}

// ---- shared records: 16-byte structs | 0 block hash u64 | 8 packed u64: node (26 bits) | worker
// slot << 26 (12 bits) | copies << 38 (26 bits). A free record has slot DEAD_WORKER and the free-list
// link in the node field. No per-node list: a record is reached through RES (worker, block hash), and
// a worker's records are found by scanning the chunks (clears, dumps).
const REC: usize = 16;
const DEAD_WORKER: u32 = 0xFFF;
const REC_MAX_COPIES: u32 = (1 << 26) - 1;
let resCap: u32 = 0;
let resTop: u32 = 1;
let resFree: u32 = NIL;
let resLive: u32 = 0; // residencies: (worker, block) pairs with at least one copy

@inline function recAt(r: u32): usize {
  return (<usize>load<u16>(recDir + (<usize>(r >> CHUNK_BITS) << 1)) << 16) + (<usize>(r & CHUNK_MASK) << 4);
}
let recDir: usize = 0;
@inline function packRec(node: u32, w: u32, copies: u32): u64 { return <u64>node | (<u64>w << 26) | (<u64>copies << 38); }
@inline function recNode(r: u32): u32 { return <u32>load<u64>(recAt(r), 8) & ID_MASK; }
@inline function recWorker(r: u32): u32 { return <u32>(load<u64>(recAt(r), 8) >> 26) & 0xFFF; }
@inline function recCopies(r: u32): u32 { return <u32>(load<u64>(recAt(r), 8) >> 38); }
@inline function setRecCopies(r: u32, c: u32): void {
  const rp = recAt(r);
  store<u64>(rp, (load<u64>(rp, 8) & ((<u64>1 << 38) - 1)) | (<u64>c << 38), 8);
}

function growRes(): void {
  if (resCap + CHUNK - 1 > MAX_REC_ID) unreachable(); // RES slots hold 25-bit record ids
  store<u16>(recDir + (<usize>(resCap >> CHUNK_BITS) << 1), <u16>(alloc(<usize>CHUNK * REC) >> 16));
  resCap += CHUNK;
}

function newRec(node: u32, w: u32, ext: u64, copies: u32): u32 {
  let r: u32;
  if (resFree != NIL) {
    r = resFree;
    resFree = <u32>load<u64>(recAt(r), 8) & ID_MASK;
  } else {
    if (resTop == resCap) growRes();
    r = resTop++;
  }
  const rp = recAt(r);
  store<u64>(rp, ext);
  store<u64>(rp, packRec(node, w, copies), 8);
  return r;
}

function freeRec(r: u32): void {
  store<u64>(recAt(r), packRec(resFree, DEAD_WORKER, 0), 8);
  resFree = r;
}

// ---- two open-addressing tables (linear probing): CHILD maps (parent node, sequence hash) -> node,
// RES maps (worker, block hash) -> the record: a node id with RES_INLINE set (its inline holder) or a
// shared record id. A slot is a u32: id in the low 26 bits (in RES: the inline flag and a 25-bit id),
// 6 hash tag bits above, so probing past foreign entries rarely dereferences them (RES had 5 and a
// 26-bit id: on the ingestion bench 115k of its 391k record reads were other keys with the same tag;
// with 6, 57k of 334k). Deletion
// leaves a tombstone; tombstones are reused by inserts and swept by a rebuild, which scans the
// node/record chunks sequentially. Capacities are not powers of two (the home slot is a multiply-shift
// of the low 32 hash bits).
const CHILD: i32 = 0;
const RES: i32 = 1;
const TOMB: u32 = 0xFFFFFFFF;
const TABLES: usize = memory.data(32, 8); // per table: slots ptr u32 | cap u32 | count u32 | tombstones u32
const MIN_TABLE: u32 = 1024;

@inline function slotsOf(t: i32): usize { return <usize>load<u32>(TABLES + (<usize>t << 4)); }
@inline function capOf(t: i32): u32 { return load<u32>(TABLES + (<usize>t << 4), 4); }
@inline function countOf(t: i32): u32 { return load<u32>(TABLES + (<usize>t << 4), 8); }
@inline function setCount(t: i32, v: u32): void { store<u32>(TABLES + (<usize>t << 4), v, 8); }
@inline function tombsOf(t: i32): u32 { return load<u32>(TABLES + (<usize>t << 4), 12); }
@inline function setTombs(t: i32, v: u32): void { store<u32>(TABLES + (<usize>t << 4), v, 12); }

@inline function keyHash(a: u32, b: u64): u64 { return mix(b ^ (<u64>(a + 1) * 0x9E3779B97F4A7C15)); }
@inline function tagOf(t: i32, h: u64): u32 { return <u32>(h >> 58) << ID_BITS; } // the same for both tables
/** Home slot: multiply-shift of the low 32 bits (the tag uses the top bits, so they stay independent). */
@inline function homeOf(h: u64, cap: u32): u32 { return <u32>((<u64><u32>h * <u64>cap) >> 32); }
@inline function nextSlot(i: u32, cap: u32): u32 { const j = i + 1; return select<u32>(0, j, j == cap); }

/** A RES value's block hash, worker and node. */
@inline function resId(v: u32): u32 { return v & RES_ID_MASK; }
@inline function resExt(v: u32): u64 { return (v & RES_INLINE) ? load<u64>(nodeAt(resId(v)), 8) : load<u64>(recAt(resId(v))); }
@inline function resWorker(v: u32): u32 { return (v & RES_INLINE) ? highAt(nodeAt(resId(v))) : recWorker(resId(v)); }
@inline function resNode(v: u32): u32 { return (v & RES_INLINE) ? resId(v) : recNode(resId(v)); }

// First empty or tombstone slot seen by the last missed find of each table (and the RES key's hash):
// inserts fill it without probing again.
let resMissAt: u32 = 0;
let resMissTomb: bool = false;
let resMissHash: u64 = 0;
let childMissAt: u32 = 0;
let childMissTomb: bool = false;
let foundAt: u32 = 0; // slot of the last RES hit

/** The RES value of (w, ext): a node id | RES_INLINE, or a record id; NIL when absent. */
@inline function resFind(w: u32, ext: u64): u32 { return resFindHashed(w, ext, keyHash(w, ext)); }

/** resFind with the key's hash (keyHash(w, ext)) already computed. */
@inline function resFindHashed(w: u32, ext: u64, h: u64): u32 {
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
@inline function childFind(parent: u32, seq: u64): u32 {
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
@inline function childMissUnderNew(seq: u64): void {
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

function tableInit(t: i32, cap: u32): void {
  store<u32>(TABLES + (<usize>t << 4), <u32>zeroed(<usize>cap << 2));
  store<u32>(TABLES + (<usize>t << 4), cap, 4);
  setTombs(t, 0);
}

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
@inline function childInsertAfterMiss(id: u32, seq: u64): void { insertAfterMiss(CHILD, id | tagOf(CHILD, seq), seq); }
@inline function resInsertAfterMiss(v: u32): void { insertAfterMiss(RES, v | tagOf(RES, resMissHash), resMissHash); }

/** Deletes the entry whose slot value (less its tag) is `v` and whose key hashes to h. */
function tableDeleteAt(t: i32, v: u32, h: u64): void {
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
function resRepoint(w: u32, ext: u64, from: u32, to: u32): void {
  const slots = slotsOf(RES), cap = capOf(RES);
  const h = keyHash(w, ext), tag = tagOf(RES, h);
  let i = homeOf(h, cap);
  while (load<u32>(slots + (<usize>i << 2)) != (from | tag)) i = nextSlot(i, cap);
  store<u32>(slots + (<usize>i << 2), to | tag);
}

// ---- zero-copy shared records by node: a small open-addressing table of (node | record << 32), so a
// node left without children finds them (inline ones are the node itself). Rare: vLLM evicts leaves
// first, so a block whose last copy goes usually has no children.
let zeroSlots: usize = 0;
let zeroCap: u32 = 0;
let zeroCount: u32 = 0;
let zeroTombs: u32 = 0;
const ZERO_TOMB: u64 = 0xFFFFFFFFFFFFFFFF;

function zeroAdd(n: u32, r: u32): void {
  if ((zeroCount + zeroTombs + 1) * 2 > zeroCap) zeroRehash(max<u32>(64, (zeroCount + 1) * 4));
  let i = homeOf(mix(<u64>n), zeroCap);
  while (true) {
    const e = load<u64>(zeroSlots + (<usize>i << 3));
    if (e == 0 || e == ZERO_TOMB) {
      if (e == ZERO_TOMB) zeroTombs--;
      store<u64>(zeroSlots + (<usize>i << 3), <u64>n | (<u64>r << 32));
      zeroCount++;
      return;
    }
    i = nextSlot(i, zeroCap);
  }
}

function zeroDel(n: u32, r: u32): void {
  const want = <u64>n | (<u64>r << 32);
  let i = homeOf(mix(<u64>n), zeroCap);
  while (load<u64>(zeroSlots + (<usize>i << 3)) != want) i = nextSlot(i, zeroCap);
  store<u64>(zeroSlots + (<usize>i << 3), ZERO_TOMB);
  zeroCount--;
  zeroTombs++;
}

/** A zero-copy shared record of worker w at node n, or NIL. */
function zeroFind(n: u32, w: u32): u32 {
  if (zeroCount == 0) return NIL;
  let i = homeOf(mix(<u64>n), zeroCap);
  while (true) {
    const e = load<u64>(zeroSlots + (<usize>i << 3));
    if (e == 0) return NIL;
    if (e != ZERO_TOMB && <u32>e == n && recWorker(<u32>(e >> 32)) == w) return <u32>(e >> 32);
    i = nextSlot(i, zeroCap);
  }
}

function zeroRehash(cap: u32): void {
  const old = zeroSlots, oldCap = zeroCap;
  zeroSlots = zeroed(<usize>cap << 3);
  zeroCap = cap;
  zeroCount = 0;
  zeroTombs = 0;
  for (let j: u32 = 0; j < oldCap; j++) {
    const e = load<u64>(old + (<usize>j << 3));
    if (e != 0 && e != ZERO_TOMB) zeroAdd(<u32>e, <u32>(e >> 32));
  }
  if (old != 0) free(old, <usize>oldCap << 3);
}

// ---- workers ----
let wCap: u32 = 0;
let wCount: usize = 0; // u32 residencies per worker slot (its tree size)
let wRecs: usize = 0; // u32 records per worker slot (residencies and zero-copy records)
let scratchMask: usize = 0;

function ensureWorker(w: u32): void {
  if (w >= wCap) {
    let cap: u32 = wCap == 0 ? 64 : wCap;
    while (cap <= w) cap *= 2;
    wCount = grow(wCount, <usize>wCap << 2, <usize>cap << 2);
    wRecs = grow(wRecs, <usize>wCap << 2, <usize>cap << 2);
    wCap = cap;
  }
  const words = (w >> 6) + 1;
  if (words > maskWords) {
    // rare: more than 64 x maskWords worker slots; re-stride the extra mask words
    const cap = max<u32>(extCap, nodeCap);
    const fresh = zeroed((<usize>cap * (words - 1)) << 3);
    if (maskWords > 1) {
      for (let n: u32 = 0; n < nodeTop; n++) {
        memory.copy(fresh + ((<usize>n * (words - 1)) << 3), nMaskExt + ((<usize>n * (maskWords - 1)) << 3), <usize>(maskWords - 1) << 3);
      }
      free(nMaskExt, (<usize>extCap * (maskWords - 1)) << 3);
    }
    nMaskExt = fresh;
    extCap = cap;
    maskWords = words;
    free(scratchMask, <usize>maskWords << 3);
    scratchMask = zeroed(<usize>words << 3);
  }
}

@inline function treeSizePtr(w: u32): usize { return wCount + (<usize>w << 2); }
@inline function recsOfPtr(w: u32): usize { return wRecs + (<usize>w << 2); }
@inline function bumpTree(w: u32, d: i32): void { store<u32>(treeSizePtr(w), load<u32>(treeSizePtr(w)) + d); }

/** Counts a record's move between zero and some copies (mask bit, tree size, totals). */
@inline function becameHeld(n: u32, w: u32, held: bool): void {
  setHeldBit(n, w, held);
  bumpTree(w, held ? 1 : -1);
  if (held) { resLive++; outBlocks++; } else resLive--; // removals count their own outBlocks
}

/**
 * Moves a node's inline holder into a shared record (a second worker arrives, or its copies outgrow
 * the inline field); the node's payload becomes the mask.
 */
function shareNode(n: u32): u32 {
  const p = nodeAt(n);
  const v = highAt(p), ext = load<u64>(p, 8), copies = inlineCopiesAt(p);
  const r = newRec(n, v, ext, copies);
  resRepoint(v, ext, n | RES_INLINE, r);
  setKindCopies(p, KIND_SHARED, 0);
  store<u64>(p, copies != 0 && v < 64 ? <u64>1 << (<u64>v) : 0, 8);
  setHigh(p, 1);
  if (copies == 0) zeroAdd(n, r);
  return r;
}

/**
 * A new record of w at node n (w has none there); resFind(w, ext) has just missed. The inline case (a
 * node's first holder: every block of an unshared sequence) is inlined into the insert path.
 */
@inline function addRecord(w: u32, n: u32, ext: u64, copies: u32): void {
  const p = nodeAt(n);
  if (kindAt(p) == KIND_NONE && copies <= INLINE_MAX_COPIES) {
    store<u64>(p, ext, 8);
    setKindCopies(p, KIND_INLINE, copies);
    setHigh(p, w);
    resInsertAfterMiss(n | RES_INLINE);
    store<u32>(recsOfPtr(w), load<u32>(recsOfPtr(w)) + 1);
    if (copies > 0) becameHeld(n, w, true);
  } else addSharedRecord(w, n, ext, copies);
}

/** addRecord when the record is a shared one: n already has a holder, or the copies outgrow the inline field. */
function addSharedRecord(w: u32, n: u32, ext: u64, copies: u32): void {
  let p = nodeAt(n);
  const kind = kindAt(p);
  if (kind == KIND_INLINE) shareNode(n);
  else if (kind == KIND_NONE) { setKindCopies(p, KIND_SHARED, 0); store<u64>(p, 0, 8); setHigh(p, 0); }
  p = nodeAt(n);
  setHigh(p, highAt(p) + 1);
  const r = newRec(n, w, ext, min<u32>(copies, REC_MAX_COPIES));
  resInsertAfterMiss(r);
  if (copies == 0) zeroAdd(n, r);
  store<u32>(recsOfPtr(w), load<u32>(recsOfPtr(w)) + 1);
  if (copies > 0) becameHeld(n, w, true);
}

/** Adds copies to w's record `v` at node n. */
function addCopies(v: u32, w: u32, n: u32, copies: u32): void {
  if (copies == 0) return;
  let before: u32;
  if (v & RES_INLINE) {
    const p = nodeAt(n);
    before = inlineCopiesAt(p);
    const after = <u64>before + copies;
    if (after <= INLINE_MAX_COPIES) setKindCopies(p, KIND_INLINE, <u32>after);
    else {
      const r = shareNode(n);
      setRecCopies(r, <u32>min<u64>(after, REC_MAX_COPIES));
      if (before == 0) zeroDel(n, r);
    }
  } else {
    const r = resId(v);
    before = recCopies(r);
    setRecCopies(r, <u32>min<u64>(<u64>before + copies, REC_MAX_COPIES));
    if (before == 0) zeroDel(n, r);
  }
  if (before == 0) becameHeld(n, w, true);
}

/** Deletes w's record `v` at node n outright (whatever its copies); the caller settles n. */
function deleteRecord(v: u32, w: u32, n: u32): void {
  const p = nodeAt(n);
  let copies: u32;
  if (v & RES_INLINE) {
    copies = inlineCopiesAt(p);
    tableDeleteAt(RES, v, keyHash(w, load<u64>(p, 8)));
    setKindCopies(p, KIND_NONE, 0);
    store<u64>(p, 0, 8);
    setHigh(p, 0);
  } else {
    const r = resId(v);
    copies = recCopies(r);
    tableDeleteAt(RES, r, keyHash(w, load<u64>(recAt(r))));
    if (copies == 0) zeroDel(n, r);
    freeRec(r);
    const left = highAt(p) - 1;
    setHigh(p, left);
    if (left == 0) { setKindCopies(p, KIND_NONE, 0); store<u64>(p, 0, 8); }
  }
  if (copies > 0) becameHeld(n, w, false);
  store<u32>(recsOfPtr(w), load<u32>(recsOfPtr(w)) - 1);
}

/** Deletes the zero-copy records at node n (it has no children: nothing below them any more). */
function purgeZeroCopies(n: u32): void {
  const p = nodeAt(n);
  const kind = kindAt(p);
  if (kind == KIND_INLINE) {
    if (inlineCopiesAt(p) == 0) deleteRecord(n | RES_INLINE, highAt(p), n);
    return;
  }
  if (kind != KIND_SHARED || zeroCount == 0) return;
  // collect first: deleting changes the table being probed
  let k: u32 = 0;
  let i = homeOf(mix(<u64>n), zeroCap);
  while (true) {
    const e = load<u64>(zeroSlots + (<usize>i << 3));
    if (e == 0) break;
    if (e != ZERO_TOMB && <u32>e == n) { appendList(<u32>(e >> 32), k); k++; }
    i = nextSlot(i, zeroCap);
  }
  for (let j: u32 = 0; j < k; j++) {
    const r = load<u32>(listPtr + (<usize>j << 2));
    deleteRecord(r, recWorker(r), n);
  }
}

/**
 * After node n lost a record or a child: a node without children loses its zero-copy records; a node
 * with neither records nor children is freed, and its parent is settled in turn.
 */
function settle(n: u32): void {
  while (n != ROOT) {
    const p = nodeAt(n);
    if (childCountAt(p) != 0) return;
    purgeZeroCopies(n);
    if (kindAt(p) != KIND_NONE) return;
    n = freeNode(n);
  }
}

/** Whether w has a record (any copies) at node n. */
function hasRecord(n: u32, w: u32): bool {
  const p = nodeAt(n);
  const kind = kindAt(p);
  if (kind == KIND_INLINE) return highAt(p) == w;
  if (kind == KIND_NONE) return false;
  return holds(n, w) || zeroFind(n, w) != NIL;
}

// ---- traversal scratch ----
let listPtr: usize = 0;
let listCap: u32 = 0;
let listLen: u32 = 0;

/** Stores v at index i of the scratch list, growing it. */
function appendList(v: u32, i: u32): void {
  if (i >= listCap) {
    let cap: u32 = listCap == 0 ? 256 : listCap * 2;
    while (cap <= i) cap *= 2;
    listPtr = grow(listPtr, <usize>listCap << 2, <usize>cap << 2);
    listCap = cap;
  }
  store<u32>(listPtr + (<usize>i << 2), v);
}

// ---- events ----
let totalRejected: u64 = 0;
let totalUnknown: u64 = 0;
let outBlocks: u32 = 0;
let outUnknown: u32 = 0;
let outRejected: u32 = 0;
let outEvents: u32 = 0;
let lastReject: u32 = 0; // 0 none, 1 unknown parent, 2 hash conflict

/** Sink for the touch passes' loads, so the optimiser keeps them. */
let touched: u32 = 0;
const TOUCH_AHEAD: u32 = 16; // a power of two (the lookups find a block's hashes at i & (TOUCH_AHEAD - 1))
/** The touch pass's sequence and RES key hashes of the window's blocks (u64 pairs), reused by the lookups. */
const TOUCH_HASHES: usize = memory.data(<i32>(TOUCH_AHEAD * 16), 16);

/**
 * Loads the home slots that blocks [from, to) of a stored event will probe. These loads do not depend
 * on each other, so the CPU keeps many cache misses in flight; the real lookups, whose probe loops and
 * branches serialise them, then hit cache. WebAssembly has no prefetch instruction: this is the
 * portable form of one. Measured at ~1M residencies: ~10% off ingestion. The hashes are computed
 * first and kept for the lookups (TOUCH_HASHES), so the loop of loads is short and more of them are in
 * flight at once (a sampling profile had the CPU waiting on these loads more than anywhere else).
 */
function touchStored(w: u32, seq: u64, ext: usize, tok: usize, from: u32, to: u32): u64 {
  for (let i = from; i < to; i++) {
    seq = childSeq(seq, load<u64>(tok + (<usize>i << 3)));
    const th = TOUCH_HASHES + (<usize>(i - from) << 4);
    store<u64>(th, seq);
    store<u64>(th, keyHash(w, load<u64>(ext + (<usize>i << 3))), 8);
  }
  const cs = slotsOf(CHILD), cc = capOf(CHILD), rs = slotsOf(RES), rc = capOf(RES);
  const end = TOUCH_HASHES + (<usize>(to - from) << 4);
  let acc: u32 = 0;
  for (let th = TOUCH_HASHES; th < end; th += 16) {
    acc += load<u32>(cs + (<usize>homeOf(load<u64>(th), cc) << 2)) + load<u32>(rs + (<usize>homeOf(load<u64>(th, 8), rc) << 2));
  }
  touched += acc;
  return seq; // the sequence hash after block to - 1: where the next window starts
}

/**
 * A stored event: `n` blocks whose block hashes are the u64 array at ext and tokens hashes the one at
 * tok; copies per block as u64 words
 * at `copies` (0: one copy each; 0 copies: a record that only names the prefix, from a dump).
 */
function stored(w: u32, hasParent: bool, parentExt: u64, ext: usize, tok: usize, copies: usize, n: u32): void {
  let cur = ROOT;
  lastReject = 0;
  if (hasParent) {
    const r = resFind(w, parentExt);
    if (r == NIL) { lastReject = 1; outRejected++; totalRejected++; return; }
    cur = resNode(r);
  }
  // the running sequence hash is computed from the event alone, so table addresses do not wait on
  // the previous block's lookup
  let touchSeq = seqOf(cur);
  let touchedTo: u32 = 0;
  let curIsNew = false; // cur was created by this event, so it has no children to find
  for (let i: u32 = 0; i < n; i++) {
    if (i == touchedTo) {
      const to = min<u32>(n, i + TOUCH_AHEAD);
      touchSeq = touchStored(w, touchSeq, ext, tok, i, to);
      touchedTo = to;
    }
    const e = load<u64>(ext + (<usize>i << 3));
    const c: u32 = copies == 0 ? 1 : <u32>min<u64>(load<u64>(copies + (<usize>i << 3)), REC_MAX_COPIES);
    const th = TOUCH_HASHES + (<usize>(i & (TOUCH_AHEAD - 1)) << 4); // windows start at multiples of TOUCH_AHEAD
    const seq = load<u64>(th);
    const held = resFindHashed(w, e, load<u64>(th, 8));
    let child: u32 = NIL;
    if (curIsNew) childMissUnderNew(seq);
    else child = childFind(cur, seq);
    if (held != NIL) {
      if (resNode(held) == child) { addCopies(held, w, child, c); cur = child; continue; } // another copy
      lastReject = 2; outRejected++; totalRejected++;
      settle(cur);
      return;
    }
    if (child != NIL && hasRecord(child, w)) {
      lastReject = 2; outRejected++; totalRejected++;
      settle(cur);
      return;
    }
    curIsNew = child == NIL;
    if (curIsNew) child = newNode(cur, seq);
    addRecord(w, child, e, c);
    cur = child;
  }
  settle(cur); // a zero-copy record the event left without children goes
}

function removed(w: u32, p: usize, n: u32): void {
  // touch every hash's home slot first (see touchStored)
  const rs = slotsOf(RES), rc = capOf(RES);
  let acc: u32 = 0;
  for (let i: u32 = 0; i < n; i++) {
    const kh = keyHash(w, load<u64>(p + (<usize>i << 3)));
    acc += load<u32>(rs + (<usize>homeOf(kh, rc) << 2));
  }
  touched += acc;
  for (let i: u32 = 0; i < n; i++) {
    const v = resFind(w, load<u64>(p + (<usize>i << 3)));
    if (v == NIL) { outUnknown++; totalUnknown++; continue; }
    const node = resNode(v), np = nodeAt(node);
    let left: u32;
    if (v & RES_INLINE) {
      left = inlineCopiesAt(np);
      if (left == 0) { outUnknown++; totalUnknown++; continue; }
      left--;
      if (left > 0 || childCountAt(np) != 0) setKindCopies(np, KIND_INLINE, left);
    } else {
      left = recCopies(resId(v));
      if (left == 0) { outUnknown++; totalUnknown++; continue; }
      left--;
      if (left > 0 || childCountAt(np) != 0) {
        setRecCopies(resId(v), left);
        if (left == 0) zeroAdd(node, resId(v));
      }
    }
    if (left > 0) continue;
    outBlocks++;
    if (childCountAt(np) != 0) becameHeld(node, w, false); // kept, with no copies, for the blocks below
    else {
      deleteRecord(v, w, node);
      settle(node);
    }
  }
}

export function clearWorker(w: u32): u32 {
  epoch++;
  ensureWorker(w);
  return clearSlot(w);
}

/** Deletes every record of w (AllBlocksCleared): one scan of the node and record chunks. */
function clearSlot(w: u32): u32 {
  const dropped = load<u32>(treeSizePtr(w));
  if (load<u32>(recsOfPtr(w)) == 0) return 0;
  let p: usize = 0;
  for (let n: u32 = 2; n < nodeTop; n++) {
    if (p == 0 || (n & CHUNK_MASK) == 0) p = nodeAt(n);
    const e = p;
    p += NODE;
    if (isDead(e) || kindAt(e) != KIND_INLINE || highAt(e) != w) continue;
    deleteRecord(n | RES_INLINE, w, n);
    settle(n);
  }
  p = 0;
  for (let r: u32 = 1; r < resTop; r++) {
    if (p == 0 || (r & CHUNK_MASK) == 0) p = recAt(r);
    const e = p;
    p += REC;
    const packed = load<u64>(e, 8);
    if ((<u32>(packed >> 26) & 0xFFF) != w) continue; // also skips free records (DEAD_WORKER)
    const n = <u32>packed & ID_MASK;
    deleteRecord(r, w, n);
    settle(n);
  }
  return dropped;
}

/**
 * Applies a batch of events from linear memory (written by src/batch-builder.ts, the only writer). Each
 * event starts with a header word kind | worker << 8 | count << 32, then:
 *   kind 3 removed: `count` block hashes
 *   kind 4 cleared: nothing
 *   kind 5 stored at the root: `count` block hashes, then `count` tokens hashes
 *   kind 6 stored under a parent: the parent's block hash, then as kind 5
 *   kind 7 / 8: as 5 / 6, then `count` copy counts (dumps: 0 names a prefix the worker does not hold)
 * Returns the words consumed; tallies are read with the getters.
 */
export function applyBatch(p: usize, words: u32): u32 {
  epoch++;
  outBlocks = 0; outUnknown = 0; outRejected = 0; outEvents = 0;
  let i: u32 = 0;
  while (i < words) {
    outEvents++;
    const h = load<u64>(p + (<usize>i << 3));
    const kind = <u32>(h & 0xff);
    const w = <u32>((h >> 8) & 0xffffff);
    const n = <u32>(h >> 32);
    ensureWorker(w);
    i++;
    if (kind == 3) {
      removed(w, p + (<usize>i << 3), n);
      i += n;
    } else if (kind == 4) {
      outBlocks += clearSlot(w);
    } else if (kind >= 5 && kind <= 8) {
      const hasParent = (kind & 1) == 0;
      let parent: u64 = 0;
      if (hasParent) { parent = load<u64>(p + (<usize>i << 3)); i++; }
      const at = p + (<usize>i << 3);
      if (kind <= 6) { stored(w, hasParent, parent, at, at + (<usize>n << 3), 0, n); i += n * 2; }
      else { stored(w, hasParent, parent, at, at + (<usize>n << 3), at + (<usize>n << 4), n); i += n * 3; }
    } else {
      unreachable();
    }
  }
  return i;
}

/**
 * Applies stored events in the binary dump layout (dump-binary.ts), all of worker slot `slot`: checks
 * every header first (known flags, words inside the batch) and applies nothing if one is bad, else
 * turns each header into this module's (kind 5-8, the slot) and applies the batch. Returns the word
 * index of the first bad header, or 0xFFFFFFFF when the events were applied.
 */
export function applyDump(p: usize, words: u32, slot: u32): u32 {
  if (slot >= DEAD_WORKER) return 0;
  let i: u32 = 0;
  while (i < words) {
    const h = load<u64>(p + (<usize>i << 3));
    const flags = <u32>h;
    if (flags > 3) return i;
    const need = <u64>(1 + (flags & 1)) + (h >> 32) * ((flags & 2) != 0 ? 3 : 2);
    if (<u64>i + need > <u64>words) return i;
    i += <u32>need;
  }
  i = 0;
  while (i < words) {
    const at = p + (<usize>i << 3);
    const flags = load<u32>(at);
    const n = load<u32>(at, 4);
    store<u32>(at, (5 + (flags & 1) + (flags & 2)) | (slot << 8));
    i += 1 + (flags & 1) + n * ((flags & 2) != 0 ? 3 : 2);
  }
  applyBatch(p, words);
  return 0xFFFFFFFF;
}

export function batchEvents(): u32 { return outEvents; }
export function batchBlocks(): u32 { return outBlocks; }
export function batchUnknown(): u32 { return outUnknown; }
export function batchRejected(): u32 { return outRejected; }
export function lastRejectReason(): u32 { return lastReject; }

// ---- queries ----

/**
 * Walks the query's tokens hashes from the root; writes (worker slot, overlap) u32 pairs at `out` for
 * every worker holding at least the first block, returns how many. A worker's overlap is the number of
 * leading blocks it holds: the walk keeps the workers that held every block so far.
 */
export function findMatches(q: usize, n: u32, out: usize): u32 {
  if (maskWords == 1) return findMatches64(q, n, out);
  let count: u32 = 0;
  let cur = ROOT;
  let depth: u32 = 0;
  const words = maskWords;
  let seq = ROOT_SEQ;
  let any = true;
  for (; depth < n && any; depth++) {
    seq = childSeq(seq, load<u64>(q + (<usize>depth << 3)));
    const child = childFind(cur, seq);
    if (child == NIL) break;
    any = false;
    for (let k: u32 = 0; k < words; k++) {
      const sp = scratchMask + (<usize>k << 3);
      const prev = depth == 0 ? 0 : load<u64>(sp);
      const m = maskWord(child, k);
      const alive = depth == 0 ? m : prev & m;
      let dropped = prev & ~alive;
      while (dropped != 0) {
        store<u32>(out + (<usize>count << 3), (k << 6) + <u32>ctz<u64>(dropped));
        store<u32>(out + (<usize>count << 3) + 4, depth);
        count++;
        dropped &= dropped - 1;
      }
      store<u64>(sp, alive);
      if (alive != 0) any = true;
    }
    cur = child;
  }
  if (depth > 0) {
    for (let k: u32 = 0; k < words; k++) {
      let rest = load<u64>(scratchMask + (<usize>k << 3));
      while (rest != 0) {
        store<u32>(out + (<usize>count << 3), (k << 6) + <u32>ctz<u64>(rest));
        store<u32>(out + (<usize>count << 3) + 4, depth);
        count++;
        rest &= rest - 1;
      }
    }
  }
  return count;
}

/** findMatches when every worker slot is below 64: the running mask stays in a local. */
function findMatches64(q: usize, n: u32, out: usize): u32 {
  let count: u32 = 0;
  let cur = ROOT;
  let depth: u32 = 0;
  let seq = ROOT_SEQ;
  let prev: u64 = 0;
  for (; depth < n; depth++) {
    seq = childSeq(seq, load<u64>(q + (<usize>depth << 3)));
    const child = childFind(cur, seq);
    if (child == NIL) break;
    const m = mask0At(nodeAt(child));
    const alive = depth == 0 ? m : prev & m;
    // workers that held every block so far but not this one stop at this depth
    let dropped = prev & ~alive;
    while (dropped != 0) {
      store<u32>(out + (<usize>count << 3), <u32>ctz<u64>(dropped));
      store<u32>(out + (<usize>count << 3) + 4, depth);
      count++;
      dropped &= dropped - 1;
    }
    prev = alive;
    if (alive == 0) break;
    cur = child;
  }
  while (prev != 0) {
    store<u32>(out + (<usize>count << 3), <u32>ctz<u64>(prev));
    store<u32>(out + (<usize>count << 3) + 4, depth);
    count++;
    prev &= prev - 1;
  }
  return count;
}

export function treeSizes(): usize { return wCount; }
export function workerCapacity(): u32 { return wCap; }

// ---- dumps: a worker's records, gathered for a group of consecutive worker slots by one scan of the
// chunks (entries of 16 bytes: node u32 | copies u32, block hash u64, bucketed by slot). Valid while
// nothing changed the index (`epoch`); a dump that interleaves with live events gathers again.
const DUMP_GROUP_MAX: u32 = 1 << 18; // records per group (4 MiB)
let epoch: u64 = 0; // bumped by every change (u64: never wraps back onto a gathered value)
let groupEpoch: u64 = u64.MAX_VALUE;
let groupLo: u32 = 0;
let groupHi: u32 = 0;
let groupBuf: usize = 0;
let groupCap: u32 = 0; // entries
let groupStart: usize = 0; // u32 per slot of the group + 1: first entry
let groupStartCap: u32 = 0;

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

// ---- I/O buffers and stats ----
export function reserve(bytes: usize): usize { return alloc(bytes); }
/** Frees a block from reserve() or dumpWorker(); `bytes` is the size it was reserved with. */
export function release(p: usize, bytes: usize): void { free(p, bytes); }
export function freeBytes(): usize { return <usize>freePages() << 16; }

export function blocks(): u32 { return nodesLive; }
export function residencies(): u32 { return resLive; }
export function rejectedTotal(): u64 { return totalRejected; }
export function unknownTotal(): u64 { return totalUnknown; }
export function bytesInUse(): usize {
  return (<usize>nodeCap * NODE) + (<usize>extCap * 8 * (maskWords - 1)) + (<usize>capOf(CHILD) << 2)
    + (<usize>resCap * REC) + (<usize>capOf(RES) << 2) + (<usize>wCap << 3) + 2 * DIR_BYTES
    + (<usize>listCap << 2) + (<usize>zeroCap << 3) + (<usize>groupCap << 4) + (<usize>groupStartCap << 2);
}

/** XXH3-64 (seed) of each full block of `blockSize` u32 token ids at `tokens`; returns the block count. */
export function computeBlockHashes(tokens: usize, nTokens: u32, blockSize: u32, seed: u64, out: usize): u32 {
  const n = nTokens / blockSize;
  const len = <usize>blockSize << 2;
  for (let i: u32 = 0; i < n; i++) store<u64>(out + (<usize>i << 3), xxh3(tokens + <usize>i * len, len, seed));
  return n;
}

/**
 * computeBlockHashes for blocks with extra keys: block i hashes its token ids followed by the
 * extra-keys bytes at trailers + spans[2i] (length spans[2i + 1]; 0 = none, the tokens alone). The
 * bytes are laid out by the wrapper (src/extra-keys.ts); `scratch` holds one block plus the longest trailer.
 */
export function computeBlockHashesExtra(tokens: usize, nBlocks: u32, blockSize: u32, seed: u64, trailers: usize, spans: usize, scratch: usize, out: usize): void {
  const len = <usize>blockSize << 2;
  for (let i: u32 = 0; i < nBlocks; i++) {
    const block = tokens + <usize>i * len;
    const tl = <usize>load<u32>(spans + (<usize>i << 3), 4);
    let h: u64;
    if (tl == 0) h = xxh3(block, len, seed);
    else {
      memory.copy(scratch, block, len);
      memory.copy(scratch + len, trailers + <usize>load<u32>(spans + (<usize>i << 3)), tl);
      h = xxh3(scratch, len + tl, seed);
    }
    store<u64>(out + (<usize>i << 3), h);
  }
}

export function hashBytes(p: usize, len: usize, seed: u64): u64 { return xxh3(p, len, seed); }

function init(): void {
  nodeDir = zeroed(DIR_BYTES);
  recDir = zeroed(DIR_BYTES);
  growNodes();
  growRes();
  memory.fill(nodeAt(NIL), 0, NODE * 2);
  memory.fill(recAt(NIL), 0, REC);
  tableInit(CHILD, MIN_TABLE);
  tableInit(RES, MIN_TABLE);
  scratchMask = zeroed(8);
  ensureWorker(0);
  // the root: never freed, no parent, not in the child index
  store<u64>(nodeAt(ROOT), ROOT_SEQ);
  nodeTop = 2;
  initJson();
}
init();
