// The KV index over linear memory. See ../README.md for the layout and why it looks like this.
//
// Sequence identity: a node is (parent node, tokens hash); node 1 is the root (the empty prefix).
// Each node stores a 64-bit sequence hash seq = mixBijective(tokens hash ^ spread(parent's seq)) and the
// child table is keyed by it. A query can then compute every level's table address from the tokens
// alone, so the CPU overlaps the cache misses of successive levels instead of chaining them (the
// parent id is still compared, so matching stays exact); and the mix is a bijection, so the tokens
// hash is recovered from (seq, parent seq) for dumps instead of being stored twice.
// Residency: (worker, node) with the worker's external hash for that block.
// Invariant (prefix semantics): a worker holding a node holds its parent, so a node's worker mask is a
// subset of its parent's, a worker's overlap is the depth of the deepest matched node it is in, and
// every residency is reachable from the root through its worker's own chain (which makes dump exact).
// Removing a block therefore drops the worker's residencies below it too.
import { xxh3 } from "./xxh3";
import { alloc, allocZeroed, free, freePages, regrow, usable } from "./pages";
export { jsonScan } from "./json-scan";

const NIL: u32 = 0;
const DEAD: u32 = 0xFFFFFFFF;
const ROOT: u32 = 1;
const EMPTY: u32 = 0;

// growable raw arrays and big blocks come from ./pages (exact page growth, freed runs reused)
@inline function grow(ptr: usize, oldBytes: usize, newBytes: usize): usize { return regrow(ptr, oldBytes, newBytes); }
@inline function zeroed(bytes: usize): usize { return allocZeroed(bytes); }

// Table slots hold 26-bit ids (6 hash bits above): an index holds at most 2^25 blocks and residencies.
const ID_BITS: u32 = 26;
const ID_MASK: u32 = (1 << ID_BITS) - 1;
const MAX_ID: u32 = ID_MASK - 1; // ID_MASK with all tag bits is the tombstone

// ---- chunked arrays: nodes and records live in fixed chunks of 8192 (whole pages: 320 KiB of nodes,
// 128 KiB of records) behind a directory holding each chunk's first page as a u16. Measured: arrays
// that doubled through realloc left the old copies' space in linear memory (58.8 B of linear memory per
// residency for 31.5 B of live structures at 1M residencies); chunks never move, growth is one chunk at
// a time, and chunks fill the runs freed tables leave. The directory's hot part is a few hundred bytes
// in L1, so the extra load per access is cheap.
const CHUNK_BITS: u32 = 13;
const CHUNK: u32 = 1 << CHUNK_BITS;
const CHUNK_MASK: u32 = CHUNK - 1;
const DIR_BYTES: usize = (<usize>1 << (ID_BITS - CHUNK_BITS)) << 1;

// ---- nodes: 40-byte structs, so creating or visiting a node touches one cache line ----
// 0 sequence hash u64 | 8 worker mask for slots 0..63 u64 | 16 parent u32 | 20 first child u32
// 24 next sibling u32 (free-list link when free) | 28 previous sibling u32 | 32 residency list head u32
const NODE: usize = 40;
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
@inline function parentOf(n: u32): u32 { return load<u32>(nodeAt(n), 16); }
@inline function firstOf(n: u32): u32 { return load<u32>(nodeAt(n), 20); }
@inline function nextOf(n: u32): u32 { return load<u32>(nodeAt(n), 24); }
@inline function prevOf(n: u32): u32 { return load<u32>(nodeAt(n), 28); }
@inline function resOf(n: u32): u32 { return load<u32>(nodeAt(n), 32); }
@inline function setFirst(n: u32, v: u32): void { store<u32>(nodeAt(n), v, 20); }
@inline function setNext(n: u32, v: u32): void { store<u32>(nodeAt(n), v, 24); }
@inline function setPrev(n: u32, v: u32): void { store<u32>(nodeAt(n), v, 28); }
@inline function setRes(n: u32, v: u32): void { store<u32>(nodeAt(n), v, 32); }
@inline function maskAt(n: u32, word: u32): usize {
  return word == 0 ? nodeAt(n) + 8 : nMaskExt + ((<usize>n * (maskWords - 1) + word - 1) << 3);
}
@inline function holds(n: u32, w: u32): bool {
  return ((load<u64>(maskAt(n, w >> 6)) >> (<u64>(w & 63))) & 1) != 0;
}

function growNodes(): void {
  if (nodeCap + CHUNK - 1 > MAX_ID) unreachable(); // table slots hold 26-bit ids
  store<u16>(nodeDir + (<usize>(nodeCap >> CHUNK_BITS) << 1), <u16>(alloc(<usize>CHUNK * NODE) >> 16));
  nodeCap += CHUNK;
  if (maskWords > 1 && nodeCap > extCap) growMaskExt(nodeCap * 2);
}

function growMaskExt(cap: u32): void {
  const stride = <usize>(maskWords - 1) << 3;
  nMaskExt = grow(nMaskExt, <usize>extCap * stride, <usize>cap * stride);
  extCap = cap;
}

/** A new child of `parent`; tableFind(CHILD, parent, seq) has just missed (its probe found the slot). */
function newNode(parent: u32, seq: u64): u32 {
  let id: u32;
  if (nodeFree != NIL) {
    id = nodeFree;
    nodeFree = nextOf(id);
  } else {
    if (nodeTop == nodeCap) growNodes();
    id = nodeTop++;
  }
  // addresses computed once: each nodeAt is a directory load the compiler cannot reuse across stores
  const p = nodeAt(id), pp = nodeAt(parent);
  const head = load<u32>(pp, 20);
  store<u64>(p, seq);
  store<u64>(p, 0, 8);
  store<u32>(p, parent, 16);
  store<u32>(p, NIL, 20);
  store<u32>(p, head, 24);
  store<u32>(p, NIL, 28);
  store<u32>(p, NIL, 32);
  if (maskWords > 1) memory.fill(maskAt(id, 1), 0, <usize>(maskWords - 1) << 3);
  if (head != NIL) setPrev(head, id);
  store<u32>(pp, id, 20);
  insertAfterMiss(CHILD, id, seq);
  nodesLive++;
  return id;
}

function freeNode(id: u32): void {
  const p = nodeAt(id);
  const prev = load<u32>(p, 28), next = load<u32>(p, 24);
  if (prev != NIL) setNext(prev, next); else setFirst(load<u32>(p, 16), next);
  if (next != NIL) setPrev(next, prev);
  tableDeleteAt(CHILD, id, load<u64>(p));
  store<u32>(p, DEAD, 16); // parent: marks the slot free for table rebuilds
  store<u32>(p, nodeFree, 24);
  nodeFree = id;
  nodesLive--;
}

// ---- residencies: records + open-addressing index (worker, external hash) -> record ----
// records: 16-byte structs | 0 external hash u64 | 8 packed u64: node (26 bits) | next residency of
// the same node, or free-list link (26 bits) << 26 | worker slot (12 bits) << 52. Packing keeps a
// residency at 16 bytes (the memory budget is 32 bytes per residency, tables included); it caps an
// index at 2^25 blocks and residencies and 4095 worker slots.
const REC: usize = 16;
const DEAD_WORKER: u32 = 0xFFF;
let resCap: u32 = 0;
let resTop: u32 = 1;
let resFree: u32 = NIL;
let resLive: u32 = 0;
let recDir: usize = 0;

@inline function recAt(r: u32): usize {
  return (<usize>load<u16>(recDir + (<usize>(r >> CHUNK_BITS) << 1)) << 16) + (<usize>(r & CHUNK_MASK) << 4);
}
@inline function extOf(r: u32): u64 { return load<u64>(recAt(r)); }
@inline function packedOf(r: u32): u64 { return load<u64>(recAt(r), 8); }
@inline function nodeOfRes(r: u32): u32 { return <u32>packedOf(r) & ID_MASK; }
@inline function nextRes(r: u32): u32 { return <u32>(packedOf(r) >> 26) & ID_MASK; }
@inline function workerOf(r: u32): u32 { return <u32>(packedOf(r) >> 52); }
@inline function pack(node: u32, next: u32, w: u32): u64 { return <u64>node | (<u64>next << 26) | (<u64>w << 52); }
@inline function setNextRes(r: u32, v: u32): void {
  store<u64>(recAt(r), (packedOf(r) & ~(<u64>ID_MASK << 26)) | (<u64>v << 26), 8);
}

function growRes(): void {
  if (resCap + CHUNK - 1 > MAX_ID) unreachable(); // table slots hold 26-bit ids
  store<u16>(recDir + (<usize>(resCap >> CHUNK_BITS) << 1), <u16>(alloc(<usize>CHUNK * REC) >> 16));
  resCap += CHUNK;
}

// ---- two open-addressing tables (linear probing): CHILD maps (parent node, sequence hash) -> node,
// RES maps (worker, external hash) -> residency record. A slot is a u32: id in the low 26 bits, 6 hash
// bits above, so probing past foreign entries rarely dereferences them (measured: most of the cost of
// a miss was those loads). Deletion leaves a tombstone instead of shifting the cluster back, because
// the shift had to load every following entry to find its home (measured as most of the cost of a
// removal); tombstones are reused by inserts and swept by a rebuild, which scans the node/record
// arrays sequentially. Capacities are not powers of two (the home slot is a multiply-shift of the low
// 32 hash bits): a table can run at up to 80% load and grow by 1.6x instead of jumping to double,
// which is what keeps the whole index near 30 bytes per residency.
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
@inline function tagOf(h: u64): u32 { return <u32>(h >> 58) << ID_BITS; }
/** Home slot: multiply-shift of the low 32 bits (the tag uses the top 6, so they stay independent). */
@inline function homeOf(h: u64, cap: u32): u32 { return <u32>((<u64><u32>h * <u64>cap) >> 32); }
@inline function nextSlot(i: u32, cap: u32): u32 { const j = i + 1; return select<u32>(0, j, j == cap); }

/** The hash of the entry with this id, read back from its node or record. */
@inline function hashOfId(t: i32, id: u32): u64 {
  return t == CHILD ? seqOf(id) : keyHash(workerOf(id), extOf(id));
}
@inline function matches(t: i32, id: u32, a: u32, b: u64): bool {
  return t == CHILD ? seqOf(id) == b && parentOf(id) == a : extOf(id) == b && workerOf(id) == a;
}

// First empty or tombstone slot seen by the last missed tableFind of each table (and the RES key's hash):
// newNode and addResidency fill it without probing again.
let resMissAt: u32 = 0;
let resMissTomb: bool = false;
let resMissHash: u64 = 0;
let childMissAt: u32 = 0;
let foundAt: u32 = 0; // slot of the last RES hit
let childMissTomb: bool = false;

@inline function tableFind(t: i32, a: u32, b: u64): u32 {
  const slots = slotsOf(t), cap = capOf(t);
  const h = t == CHILD ? b : keyHash(a, b), tag = tagOf(h);
  let i = homeOf(h, cap);
  let free: u32 = 0xFFFFFFFF;
  while (true) {
    const v = load<u32>(slots + (<usize>i << 2));
    if (v == EMPTY) break;
    if (v == TOMB) {
      if (free == 0xFFFFFFFF) free = i;
    } else if ((v & ~ID_MASK) == tag && matches(t, v & ID_MASK, a, b)) {
      if (t == RES) foundAt = i;
      return v & ID_MASK;
    }
    i = nextSlot(i, cap);
  }
  if (t == RES) {
    resMissTomb = free != 0xFFFFFFFF;
    resMissAt = resMissTomb ? free : i;
    resMissHash = h;
  } else {
    childMissTomb = free != 0xFFFFFFFF;
    childMissAt = childMissTomb ? free : i;
  }
  return NIL;
}

/** Puts an id whose key is absent into the first free or tombstone slot of its probe sequence. */
function tablePlace(slots: usize, cap: u32, h: u64, id: u32): bool {
  let i = homeOf(h, cap);
  while (true) {
    const v = load<u32>(slots + (<usize>i << 2));
    if (v == EMPTY || v == TOMB) {
      store<u32>(slots + (<usize>i << 2), id | tagOf(h));
      return v == TOMB;
    }
    i = nextSlot(i, cap);
  }
}

function tableInit(t: i32, cap: u32): void {
  store<u32>(TABLES + (<usize>t << 4), <u32>zeroed(<usize>cap << 2));
  store<u32>(TABLES + (<usize>t << 4), cap, 4);
  setTombs(t, 0);
}

@inline function tableFull(t: i32): bool { return (countOf(t) + tombsOf(t) + 1) * 5 > capOf(t) * 4; }

/** Indexes a node or record already written to its array (a rebuild picks it up from there). */
function tableInsert(t: i32, id: u32): void {
  if (tableFull(t)) tableRebuild(t, countOf(t) + 1);
  else if (tablePlace(slotsOf(t), capOf(t), hashOfId(t, id), id)) setTombs(t, tombsOf(t) - 1);
  setCount(t, countOf(t) + 1);
}

/** tableInsert for a key (hash h) the table's last tableFind just missed: fills the slot that probe found. */
function insertAfterMiss(t: i32, id: u32, h: u64): void {
  if (tableFull(t)) tableRebuild(t, countOf(t) + 1);
  else {
    const at = t == RES ? resMissAt : childMissAt;
    store<u32>(slotsOf(t) + (<usize>at << 2), id | tagOf(h));
    if (t == RES ? resMissTomb : childMissTomb) setTombs(t, tombsOf(t) - 1);
  }
  setCount(t, countOf(t) + 1);
}

/** Deletes the entry with this id, whose key hashes to h. */
function tableDeleteAt(t: i32, id: u32, h: u64): void {
  const slots = slotsOf(t), cap = capOf(t);
  let i = homeOf(h, cap);
  while ((load<u32>(slots + (<usize>i << 2)) & ID_MASK) != id) i = nextSlot(i, cap);
  store<u32>(slots + (<usize>i << 2), TOMB);
  setCount(t, countOf(t) - 1);
  setTombs(t, tombsOf(t) + 1);
}

// ---- workers ----
let wCap: u32 = 0;
let wCount: usize = 0; // u32 residencies per worker slot (its tree size)
let scratchMask: usize = 0;

function ensureWorker(w: u32): void {
  if (w >= wCap) {
    let cap: u32 = wCap == 0 ? 64 : wCap;
    while (cap <= w) cap *= 2;
    wCount = grow(wCount, <usize>wCap << 2, <usize>cap << 2);
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

/** `afterMiss`: tableFind(RES) just missed this key, so its probe already found the free slot. */
function addResidency(w: u32, node: u32, ext: u64, afterMiss: bool): void {
  let r: u32;
  if (resFree != NIL) {
    r = resFree;
    resFree = nextRes(r);
  } else {
    if (resTop == resCap) growRes();
    r = resTop++;
  }
  const rp = recAt(r), np = nodeAt(node);
  store<u64>(rp, ext);
  store<u64>(rp, pack(node, load<u32>(np, 32), w), 8);
  store<u32>(np, r, 32);
  if (afterMiss) insertAfterMiss(RES, r, resMissHash); else tableInsert(RES, r);
  const mp = w < 64 ? np + 8 : maskAt(node, w >> 6);
  store<u64>(mp, load<u64>(mp) | (<u64>1 << (<u64>(w & 63))));
  store<u32>(treeSizePtr(w), load<u32>(treeSizePtr(w)) + 1);
  resLive++;
}

/** The worker's residency record at a node it holds. */
function recordAt(node: u32, w: u32): u32 {
  let r = resOf(node);
  while (workerOf(r) != w) r = nextRes(r);
  return r;
}

/** The record a removal just found through tableFind(RES), and its slot: its deletion skips the probe. */
let foundRec: u32 = NIL;

function dropResidency(node: u32, w: u32): void {
  const np = nodeAt(node);
  let prev: u32 = NIL;
  let r = load<u32>(np, 32);
  while (workerOf(r) != w) { prev = r; r = nextRes(r); }
  const rp = recAt(r);
  const after = <u32>(load<u64>(rp, 8) >> 26) & ID_MASK;
  if (prev == NIL) store<u32>(np, after, 32); else setNextRes(prev, after);
  if (r == foundRec) {
    store<u32>(slotsOf(RES) + (<usize>foundAt << 2), TOMB);
    setCount(RES, countOf(RES) - 1);
    setTombs(RES, tombsOf(RES) + 1);
    foundRec = NIL;
  } else {
    tableDeleteAt(RES, r, keyHash(w, load<u64>(rp)));
  }
  store<u64>(rp, pack(0, resFree, DEAD_WORKER), 8); // marks the slot free for table rebuilds
  resFree = r;
  resLive--;
  const mp = w < 64 ? np + 8 : maskAt(node, w >> 6);
  store<u64>(mp, load<u64>(mp) & ~(<u64>1 << (<u64>(w & 63))));
  store<u32>(treeSizePtr(w), load<u32>(treeSizePtr(w)) - 1);
  if (load<u32>(np, 32) == NIL) freeNode(node);
}

// ---- traversal scratch: the worker's nodes under a start node, parents before children ----
let listPtr: usize = 0;
let listCap: u32 = 0;
let listLen: u32 = 0;
let stackPtr: usize = 0;
let stackCap: u32 = 0;

function pushStack(len: u32, v: u32): u32 {
  if (len == stackCap) {
    const cap = stackCap == 0 ? 256 : stackCap * 2;
    stackPtr = grow(stackPtr, <usize>stackCap << 2, <usize>cap << 2);
    stackCap = cap;
  }
  store<u32>(stackPtr + (<usize>len << 2), v);
  return len + 1;
}

function appendList(v: u32): void {
  if (listLen == listCap) {
    const cap = listCap == 0 ? 256 : listCap * 2;
    listPtr = grow(listPtr, <usize>listCap << 2, <usize>cap << 2);
    listCap = cap;
  }
  store<u32>(listPtr + (<usize>listLen << 2), v);
  listLen++;
}

/** Fills the list with the worker's nodes in the subtree of `start` (itself included unless root). */
function collect(start: u32, w: u32): void {
  listLen = 0;
  let sp = pushStack(0, start);
  while (sp > 0) {
    sp--;
    const n = load<u32>(stackPtr + (<usize>sp << 2));
    if (n != ROOT) appendList(n);
    for (let c = firstOf(n); c != NIL; c = nextOf(c)) {
      if (holds(c, w)) sp = pushStack(sp, c);
    }
  }
}

function dropSubtree(start: u32, w: u32): u32 {
  collect(start, w);
  const count = listLen;
  for (let i = count; i > 0; i--) dropResidency(load<u32>(listPtr + (<usize>(i - 1) << 2)), w);
  return count;
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
const TOUCH_AHEAD: u32 = 16;

/**
 * Loads the home slots that blocks [from, to) of a stored event will probe. These loads do not depend
 * on each other, so the CPU keeps many cache misses in flight; the real lookups, whose probe loops and
 * branches serialise them, then hit cache. WebAssembly has no prefetch instruction: this is the
 * portable form of one. Measured at ~1M residencies: ~10% off ingestion; also loading the entries the
 * slots name (when the tag agrees) cost more instructions than the misses it saved.
 */
function touchStored(w: u32, seq: u64, ext: usize, tok: usize, stride: usize, from: u32, to: u32): u64 {
  const cs = slotsOf(CHILD), cc = capOf(CHILD), rs = slotsOf(RES), rc = capOf(RES);
  let acc: u32 = 0;
  for (let i = from; i < to; i++) {
    seq = childSeq(seq, load<u64>(tok + <usize>i * stride));
    const kh = keyHash(w, load<u64>(ext + <usize>i * stride));
    const c = load<u32>(cs + (<usize>homeOf(seq, cc) << 2));
    const r = load<u32>(rs + (<usize>homeOf(kh, rc) << 2));
    acc += c + r;
  }
  touched += acc;
  return seq; // the sequence hash after block to - 1: where the next window starts
}

/**
 * A stored event: `n` blocks whose external hashes are at ext + i * stride and tokens hashes at
 * tok + i * stride (interleaved pairs: stride 16; two arrays: stride 8).
 */
function stored(w: u32, hasParent: bool, parentExt: u64, ext: usize, tok: usize, stride: usize, n: u32): void {
  let cur = ROOT;
  lastReject = 0;
  if (hasParent) {
    const r = tableFind(RES, w, parentExt);
    if (r == NIL) { lastReject = 1; outRejected++; totalRejected++; return; }
    cur = nodeOfRes(r);
  }
  // the running sequence hash is computed from the event alone, so table addresses do not wait on
  // the previous block's lookup
  let seq = seqOf(cur);
  let touchSeq = seq;
  let touchedTo: u32 = 0;
  for (let i: u32 = 0; i < n; i++) {
    if (i == touchedTo) {
      // touch the next window of blocks; the seq chain of the window is carried over
      const to = min<u32>(n, i + TOUCH_AHEAD);
      touchSeq = touchStored(w, touchSeq, ext, tok, stride, i, to);
      touchedTo = to;
    }
    const e = load<u64>(ext + <usize>i * stride);
    seq = childSeq(seq, load<u64>(tok + <usize>i * stride));
    const held = tableFind(RES, w, e);
    let child = tableFind(CHILD, cur, seq);
    if (held != NIL || (child != NIL && holds(child, w))) {
      if (held != NIL && nodeOfRes(held) == child) { cur = child; continue; } // idempotent re-store
      lastReject = 2; outRejected++; totalRejected++;
      return;
    }
    if (child == NIL) child = newNode(cur, seq);
    addResidency(w, child, e, true);
    outBlocks++;
    cur = child;
  }
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
    const r = tableFind(RES, w, load<u64>(p + (<usize>i << 3)));
    if (r == NIL) { outUnknown++; totalUnknown++; continue; }
    foundRec = r; // its slot is foundAt: dropResidency reuses it (no table change happens before)
    outBlocks += dropSubtree(nodeOfRes(r), w);
    foundRec = NIL;
  }
}

export function clearWorker(w: u32): u32 {
  epoch++;
  ensureWorker(w);
  return dropSubtree(ROOT, w);
}

/**
 * Applies encoded events from linear memory. Each event starts with a header word
 * kind | worker << 8 | count << 32, then:
 *   kind 1 stored at the root: `count` (external hash, tokens hash) pairs
 *   kind 2 stored under a parent: the parent's external hash, then the pairs
 *   kind 3 removed: `count` external hashes
 *   kind 4 cleared: nothing
 *   kind 5 / 6: as 1 / 2 but with the `count` external hashes first, then the `count` tokens hashes
 *   (two arrays copied in whole by the batch builder, instead of interleaved pairs)
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
    if (kind == 1 || kind == 2 || kind == 5 || kind == 6) {
      const hasParent = kind == 2 || kind == 6;
      let parent: u64 = 0;
      if (hasParent) { parent = load<u64>(p + (<usize>i << 3)); i++; }
      const at = p + (<usize>i << 3);
      if (kind <= 2) stored(w, hasParent, parent, at, at + 8, 16, n);
      else stored(w, hasParent, parent, at, at + (<usize>n << 3), 8, n);
      i += n * 2;
    } else if (kind == 3) {
      removed(w, p + (<usize>i << 3), n);
      i += n;
    } else if (kind == 4) {
      outBlocks += dropSubtree(ROOT, w);
    } else {
      unreachable();
    }
  }
  return i;
}

/**
 * Checks a batch from outside (applyEncoded) before anything is applied: known kinds, worker slots
 * below DEAD_WORKER, and every event's words inside the batch. Returns the word index of the first
 * bad header, or 0xFFFFFFFF when the batch is well formed.
 */
export function validateBatch(p: usize, words: u32): u32 {
  let i: u32 = 0;
  while (i < words) {
    const h = load<u64>(p + (<usize>i << 3));
    const kind = <u32>(h & 0xff);
    const w = <u32>((h >> 8) & 0xffffff);
    const n = <u64>(h >> 32);
    if (w >= DEAD_WORKER) return i;
    let need: u64;
    if (kind == 1 || kind == 5) need = 1 + n * 2;
    else if (kind == 2 || kind == 6) need = 2 + n * 2;
    else if (kind == 3) need = 1 + n;
    else if (kind == 4) need = 1;
    else return i;
    if (<u64>i + need > <u64>words) return i;
    i += <u32>need;
  }
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
 * every worker holding at least the first block, returns how many.
 */
export function findMatches(q: usize, n: u32, out: usize): u32 {
  if (maskWords == 1) return findMatches64(q, n, out);
  let count: u32 = 0;
  let cur = ROOT;
  let depth: u32 = 0;
  const words = maskWords;
  let seq = ROOT_SEQ;
  for (; depth < n; depth++) {
    seq = childSeq(seq, load<u64>(q + (<usize>depth << 3)));
    const child = tableFind(CHILD, cur, seq);
    if (child == NIL) break;
    for (let k: u32 = 0; k < words; k++) {
      const m = load<u64>(maskAt(child, k));
      const sp = scratchMask + (<usize>k << 3);
      if (depth > 0) {
        // workers in the parent but not here stop at this depth (masks only shrink going down)
        let dropped = load<u64>(sp) & ~m;
        while (dropped != 0) {
          const bit = <u32>ctz<u64>(dropped);
          dropped &= dropped - 1;
          store<u32>(out + (<usize>count << 3), (k << 6) + bit);
          store<u32>(out + (<usize>count << 3) + 4, depth);
          count++;
        }
      }
      store<u64>(sp, m);
    }
    cur = child;
  }
  if (depth > 0) {
    for (let k: u32 = 0; k < words; k++) {
      let rest = load<u64>(scratchMask + (<usize>k << 3));
      while (rest != 0) {
        const bit = <u32>ctz<u64>(rest);
        rest &= rest - 1;
        store<u32>(out + (<usize>count << 3), (k << 6) + bit);
        store<u32>(out + (<usize>count << 3) + 4, depth);
        count++;
      }
    }
  }
  return count;
}

/** findMatches when every worker slot is below 64: the previous level's mask stays in a local. */
function findMatches64(q: usize, n: u32, out: usize): u32 {
  let count: u32 = 0;
  let cur = ROOT;
  let depth: u32 = 0;
  let seq = ROOT_SEQ;
  let prev: u64 = 0;
  for (; depth < n; depth++) {
    seq = childSeq(seq, load<u64>(q + (<usize>depth << 3)));
    const child = tableFind(CHILD, cur, seq);
    if (child == NIL) break;
    const m = load<u64>(nodeAt(child), 8);
    // workers in the parent but not here stop at this depth (masks only shrink going down)
    let dropped = prev & ~m;
    while (dropped != 0) {
      store<u32>(out + (<usize>count << 3), <u32>ctz<u64>(dropped));
      store<u32>(out + (<usize>count << 3) + 4, depth);
      count++;
      dropped &= dropped - 1;
    }
    prev = m;
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

/**
 * Copies the worker's residencies, parents before children, as (parent external hash, external hash,
 * tokens hash, has-parent) u64 quadruples into a fresh buffer; the caller frees it with release().
 * Depth-first order keeps each single-child chain contiguous. The parent's external hash is read from the
 * parent's row (written earlier), and the worker's record at a node from the dump cache below: measured,
 * walking each node's residency list (64 long at a prefix all workers share) twice per row was ~90% of
 * the cost (~600 ms for 1M residencies over 64 workers, ~100 ms now).
 */
export function dumpWorker(w: u32): usize {
  ensureWorker(w);
  collectWithParents(w);
  const useCache = dumpCacheFor(w);
  const out = alloc(<usize>max<u32>(listLen, 1) << 5); // the caller frees it: release(out, max(len, 1) * 32)
  for (let i: u32 = 0; i < listLen; i++) {
    const n = load<u32>(listPtr + (<usize>i << 2));
    const pi = load<u32>(parentIdxPtr + (<usize>i << 2));
    const o = out + (<usize>i << 5);
    store<u64>(o, pi == NO_PARENT ? 0 : load<u64>(out + (<usize>pi << 5), 8));
    store<u64>(o + 8, useCache ? cachedExt(n, w) : extOf(recordAt(n, w)));
    store<u64>(o + 16, tokOf(n));
    store<u64>(o + 24, pi == NO_PARENT ? 0 : 1);
  }
  return out;
}

// Traversal for dumps: like collect(ROOT, w), plus each node's parent's position in the list.
const NO_PARENT: u32 = 0xFFFFFFFF;
let parentIdxPtr: usize = 0;
let parentIdxCap: u32 = 0;

function collectWithParents(w: u32): void {
  listLen = 0;
  let sp = pushStack(0, ROOT);
  sp = pushStack(sp, NO_PARENT);
  while (sp > 0) {
    const pi = load<u32>(stackPtr + (<usize>(sp - 1) << 2));
    const n = load<u32>(stackPtr + (<usize>(sp - 2) << 2));
    sp -= 2;
    let me = NO_PARENT;
    if (n != ROOT) {
      me = listLen;
      if (listLen == parentIdxCap) {
        const cap = parentIdxCap == 0 ? 256 : parentIdxCap * 2;
        parentIdxPtr = grow(parentIdxPtr, <usize>parentIdxCap << 2, <usize>cap << 2);
        parentIdxCap = cap;
      }
      store<u32>(parentIdxPtr + (<usize>listLen << 2), pi);
      appendList(n);
    }
    for (let c = firstOf(n); c != NIL; c = nextOf(c)) {
      if (holds(c, w)) {
        sp = pushStack(sp, c);
        sp = pushStack(sp, me);
      }
    }
  }
}

// ---- dump cache: (node, worker) -> external hash for a group of worker slots, filled by one sequential
// scan of the residency records. Valid while nothing changed the index (`epoch`); a dump that interleaves
// with live events just rebuilds it (or, for a worker too big for it, walks the residency lists).
const DUMP_CACHE_MAX: u32 = 1 << 18; // residencies per group: an 8 MiB table (measured ~20% faster than 4 MiB at 1M residencies)
let epoch: u64 = 0; // bumped by every change (u64: never wraps back onto a cached value)
let cacheEpoch: u64 = u64.MAX_VALUE;
let cacheLo: u32 = 0;
let cacheHi: u32 = 0;
let cacheTable: usize = 0; // 16-byte entries: key node | worker << 32 (0 = empty), external hash
let cacheCap: u32 = 0;

@inline function cacheHome(key: u64, cap: u32): u32 { return homeOf(mix(key), cap); }

function dumpCacheFor(w: u32): bool {
  if (cacheTable != 0 && cacheEpoch == epoch && w >= cacheLo && w < cacheHi) return true;
  const first = load<u32>(treeSizePtr(w));
  if (first > DUMP_CACHE_MAX) return false;
  // the group: w and the following slots while their residencies fit
  let total = first, hi = w + 1;
  while (hi < wCap && total + load<u32>(treeSizePtr(hi)) <= DUMP_CACHE_MAX) total += load<u32>(treeSizePtr(hi++));
  const cap = max<u32>(1024, total * 2);
  if (cap > cacheCap) {
    dumpCacheRelease();
    cacheTable = alloc(<usize>cap << 4);
    cacheCap = cap;
  }
  memory.fill(cacheTable, 0, <usize>cacheCap << 4);
  const table = cacheTable, tcap = cacheCap;
  let p: usize = 0;
  for (let r: u32 = 1; r < resTop; r++) {
    if (p == 0 || (r & CHUNK_MASK) == 0) p = recAt(r);
    const e = p;
    p += REC;
    const packed = load<u64>(e, 8);
    const rw = <u32>(packed >> 52);
    if (rw < w || rw >= hi) continue; // also skips free records (DEAD_WORKER)
    const key = (<u64><u32>(packed & ID_MASK)) | (<u64>rw << 32);
    let i = cacheHome(key, tcap);
    while (load<u64>(table + (<usize>i << 4)) != 0) i = nextSlot(i, tcap);
    store<u64>(table + (<usize>i << 4), key);
    store<u64>(table + (<usize>i << 4), load<u64>(e), 8);
  }
  cacheLo = w;
  cacheHi = hi;
  cacheEpoch = epoch;
  return true;
}

function cachedExt(n: u32, w: u32): u64 {
  const key = (<u64>n) | (<u64>w << 32);
  const table = cacheTable, cap = cacheCap;
  let i = cacheHome(key, cap);
  while (true) {
    const k = load<u64>(table + (<usize>i << 4));
    if (k == key) return load<u64>(table + (<usize>i << 4), 8);
    if (k == 0) return extOf(recordAt(n, w)); // cannot happen while the epoch holds; stay exact anyway
    i = nextSlot(i, cap);
  }
}

/** Frees the dump cache (KvIndex calls it when a dump ends; a running dump just rebuilds it). */
export function dumpCacheRelease(): void {
  if (cacheTable != 0) free(cacheTable, <usize>cacheCap << 4);
  cacheTable = 0;
  cacheCap = 0;
  cacheEpoch = u64.MAX_VALUE;
}
export function dumpLength(): u32 { return listLen; }

// ---- the dump as JSON: RouterEvents of the recovery `/dump` body (DESIGN.md section 6) written from a
// dumpWorker() snapshot straight into linear memory. Measured on the 1M-residency recovery bench: the
// TypeScript path (DumpEvent objects, BigInts, then digits from doubles) made the sender the bottleneck;
// here a block is two u64 -> decimal conversions and a few fixed-byte stores. The caller owns the state
// (so several dumps of one index may run at once) and the output buffer; emission stops after the step
// that reaches `limit` and resumes from the state, so a chain of any length streams in bounded chunks.
// State (48 bytes): 0 rows u32 | 4 rows len u32 | 8 pos u32 | 12 flags u32 (1 = inside an event, 2 = an
// event was written: the next one needs a comma) | 16 next event id u64 | 24 prefix ptr u32 | 28 prefix
// len u32 | 32 suffix ptr u32 | 36 suffix len u32. Prefix = `{"worker_id":<json string>,"event":{"event_id":`,
// suffix = `]}}},"dp_rank":<rank>}`, both from the caller. The output needs 16 bytes of slack past each
// step (fixed strings are copied as whole 16-byte words).
let digits2: usize = 0; // "00".."99"
let jsonData: usize = 0; // `,"data":{"stored":{"parent_hash":` (33) then `,"blocks":[` (11)
let jsonBlock: usize = 0; // `,{"block_hash":` (15; the first block skips the comma)
let jsonTokens: usize = 0; // `,"tokens_hash":` (15)
let jsonNull: usize = 0; // `null`

function asciiConst(s: string): usize {
  const n = s.length;
  const p = alloc(<usize>(n + 16)); // small: TLSF; padded so 16-byte copies never read past it
  memory.fill(p, 0, <usize>(n + 16));
  for (let i = 0; i < n; i++) store<u8>(p + <usize>i, <u8>s.charCodeAt(i));
  return p;
}

function initJson(): void {
  digits2 = alloc(200);
  for (let i: u32 = 0; i < 100; i++) {
    store<u8>(digits2 + (<usize>i << 1), <u8>(48 + i / 10));
    store<u8>(digits2 + (<usize>i << 1) + 1, <u8>(48 + i % 10));
  }
  jsonData = asciiConst(',"data":{"stored":{"parent_hash":,"blocks":[');
  jsonBlock = asciiConst(',{"block_hash":');
  jsonTokens = asciiConst(',"tokens_hash":');
  jsonNull = asciiConst("null");
}

@inline function copy16(o: usize, p: usize): void {
  store<u64>(o, load<u64>(p));
  store<u64>(o, load<u64>(p, 8), 8);
}
@inline function put2(o: usize, n: u32): void { store<u16>(o, load<u16>(digits2 + (<usize>n << 1))); }

/** Exactly 8 digits (zero-padded) of n < 10^8. */
@inline function write8(o: usize, n: u32): usize {
  const a = n / 10000, b = n - a * 10000;
  const a1 = a / 100, b1 = b / 100;
  put2(o, a1); put2(o + 2, a - a1 * 100); put2(o + 4, b1); put2(o + 6, b - b1 * 100);
  return o + 8;
}

/** The digits of n < 10^8 without leading zeros. */
function writeSmall(o: usize, n: u32): usize {
  const len: u32 = n < 10 ? 1 : n < 100 ? 2 : n < 1000 ? 3 : n < 10000 ? 4 : n < 100000 ? 5 : n < 1000000 ? 6 : n < 10000000 ? 7 : 8;
  let e = o + <usize>len;
  while (n >= 100) {
    const q = n / 100;
    e -= 2;
    put2(e, n - q * 100);
    n = q;
  }
  if (n >= 10) { e -= 2; put2(e, n); } else store<u8>(e - 1, <u8>(48 + n));
  return o + <usize>len;
}

/** Exact decimal of a u64 (at most 20 digits). */
function writeU64(o: usize, v: u64): usize {
  if (v < 100000000) return writeSmall(o, <u32>v);
  const hi = v / 100000000;
  const lo = <u32>(v - hi * 100000000);
  if (hi < 100000000) o = writeSmall(o, <u32>hi);
  else {
    const top = <u32>(hi / 100000000); // < 184468
    o = writeSmall(o, top);
    o = write8(o, <u32>(hi - <u64>top * 100000000));
  }
  return write8(o, lo);
}

/** One block `{"block_hash":e,"tokens_hash":t}`, with a leading comma unless it is the event's first. */
@inline function writeBlock(o: usize, ext: u64, tok: u64, first: bool): usize {
  copy16(o, jsonBlock + (first ? 1 : 0));
  o += first ? 14 : 15;
  o = writeU64(o, ext);
  copy16(o, jsonTokens);
  o = writeU64(o + 15, tok);
  store<u8>(o, 0x7d);
  return o + 1;
}

export function dumpJson(st: usize, o: usize, limit: usize): usize {
  const rows = <usize>load<u32>(st), len = load<u32>(st, 4);
  let pos = load<u32>(st, 8), flags = load<u32>(st, 12);
  let eventId = load<u64>(st, 16);
  const prefix = <usize>load<u32>(st, 24), prefixLen = <usize>load<u32>(st, 28);
  const suffix = <usize>load<u32>(st, 32), suffixLen = <usize>load<u32>(st, 36);
  while (o < limit) {
    if (flags & 1) {
      // inside an event: the next row continues its chain if it hangs off the previous row's block
      if (pos < len) {
        const r = rows + (<usize>pos << 5);
        if (load<u64>(r, 24) != 0 && load<u64>(r) == load<u64>(r - 24)) {
          o = writeBlock(o, load<u64>(r, 8), load<u64>(r, 16), false);
          pos++;
          continue;
        }
      }
      memory.copy(o, suffix, suffixLen);
      o += suffixLen;
      flags = 2;
      continue;
    }
    if (pos >= len) break;
    const r = rows + (<usize>pos << 5);
    if (flags & 2) { store<u8>(o, 0x2c); o++; }
    memory.copy(o, prefix, prefixLen);
    o = writeU64(o + prefixLen, eventId++);
    memory.copy(o, jsonData, 33);
    o += 33;
    if (load<u64>(r, 24) != 0) o = writeU64(o, load<u64>(r));
    else { store<u32>(o, load<u32>(jsonNull)); o += 4; }
    memory.copy(o, jsonData + 33, 11);
    o = writeBlock(o + 11, load<u64>(r, 8), load<u64>(r, 16), true);
    pos++;
    flags = 3;
  }
  store<u32>(st, pos, 8);
  store<u32>(st, flags, 12);
  store<u64>(st, eventId, 16);
  return o;
}

/**
 * Grows the arrays and tables up front for an expected number of blocks and residencies, so a large
 * initial load (a recovery dump, a benchmark) does not pay for repeated doubling and rehashing.
 */
export function presize(blocksWanted: u32, residenciesWanted: u32): void {
  while (nodeCap < blocksWanted + 2) growNodes();
  while (resCap < residenciesWanted + 1) growRes();
  tableReserve(CHILD, blocksWanted);
  tableReserve(RES, residenciesWanted);
}

function tableReserve(t: i32, entries: u32): void {
  if (entries * 5 > capOf(t) * 4) tableRebuild(t, entries);
}

/**
 * Rebuilds a table (dropping tombstones). It keeps its capacity while that leaves `entries` under 60%
 * load (at least a fifth of the table then absorbs tombstones before the next rebuild: steady churn
 * keeps its footprint), else grows to 2.5x `entries` (the capacity doubles: a table grown at 80% load
 * restarts at 40%). Measured with bench:index, ingesting 1M block events into an empty index: growing
 * 1.6x re-placed ~2.7 entries per final entry and ingestion ran at ~8.7M events/s; doubling re-places
 * ~2 and runs at ~10.5-11M/s, for ~3 more bytes per residency at 1M residencies (28.9 -> 31.9). Entries are re-placed from the node/record
 * arrays in id order rather than from the old slots (sequential key reads instead of one cache miss per
 * entry), and, for big tables, in batches sorted by home slot: the home is a multiply-shift, so slots
 * are then filled in one ascending sweep instead of at random. Measured: without the sort, rebuilds
 * were about a third of the cost of ingesting 1M block events into an empty index.
 */
function tableRebuild(t: i32, entries: u32): void {
  let cap = capOf(t);
  if (entries * 5 > cap * 3) cap = max<u32>(MIN_TABLE, entries * 5 / 2);
  free(slotsOf(t), <usize>capOf(t) << 2);
  cap = <u32>(usable(<usize>cap << 2) >> 2); // a table in whole pages uses all of them
  tableInit(t, cap);
  const slots = slotsOf(t);
  const first: u32 = t == CHILD ? 2 : 1;
  const top: u32 = t == CHILD ? nodeTop : resTop;
  if (cap < SORTED_REBUILD_MIN) {
    for (let id = first; id < top; id++) {
      if (live(t, id)) tablePlace(slots, cap, hashOfId(t, id), id);
    }
    return;
  }
  const batch = min<u32>(REBUILD_BATCH, top - first);
  const pairs = alloc(<usize>batch << 3), sorted = alloc(<usize>batch << 3);
  const counts = alloc(<usize>REBUILD_BUCKETS << 2);
  const ceilLog: u32 = 32 - <u32>clz<u32>(cap - 1);
  const shift: u32 = ceilLog - REBUILD_BUCKET_BITS; // cap >= SORTED_REBUILD_MIN > REBUILD_BUCKETS
  let id = first;
  while (id < top) {
    // one batch: (home, slot value) pairs, counting-sorted by the home's top bits, then placed in order
    let k: u32 = 0;
    memory.fill(counts, 0, <usize>REBUILD_BUCKETS << 2);
    let p: usize = 0; // the entry's address, stepped within a chunk instead of looked up per id
    for (; id < top && k < batch; id++) {
      if (p == 0 || (id & CHUNK_MASK) == 0) p = t == CHILD ? nodeAt(id) : recAt(id);
      const e = p;
      p += t == CHILD ? NODE : REC;
      let h: u64;
      if (t == CHILD) {
        if (load<u32>(e, 16) == DEAD) continue;
        h = load<u64>(e);
      } else {
        const w = <u32>(load<u64>(e, 8) >> 52);
        if (w == DEAD_WORKER) continue;
        h = keyHash(w, load<u64>(e));
      }
      const home = homeOf(h, cap);
      store<u64>(pairs + (<usize>k << 3), (<u64>(id | tagOf(h)) << 32) | <u64>home);
      const c = counts + (<usize>(home >> shift) << 2);
      store<u32>(c, load<u32>(c) + 1);
      k++;
    }
    let sum: u32 = 0;
    for (let b: u32 = 0; b < REBUILD_BUCKETS; b++) {
      const c = counts + (<usize>b << 2);
      const n = load<u32>(c);
      store<u32>(c, sum);
      sum += n;
    }
    for (let j: u32 = 0; j < k; j++) {
      const v = load<u64>(pairs + (<usize>j << 3));
      const c = counts + (<usize>(<u32>v >> shift) << 2);
      const at = load<u32>(c);
      store<u32>(c, at + 1);
      store<u64>(sorted + (<usize>at << 3), v);
    }
    for (let j: u32 = 0; j < k; j++) {
      const v = load<u64>(sorted + (<usize>j << 3));
      let i = <u32>v;
      while (load<u32>(slots + (<usize>i << 2)) != EMPTY) i = nextSlot(i, cap);
      store<u32>(slots + (<usize>i << 2), <u32>(v >> 32));
    }
  }
  free(pairs, <usize>batch << 3);
  free(sorted, <usize>batch << 3);
  free(counts, <usize>REBUILD_BUCKETS << 2);
}

const SORTED_REBUILD_MIN: u32 = 1 << 16;
const REBUILD_BATCH: u32 = 1 << 17;
const REBUILD_BUCKET_BITS: u32 = 12;
const REBUILD_BUCKETS: u32 = 1 << REBUILD_BUCKET_BITS;

@inline function live(t: i32, id: u32): bool {
  return t == CHILD ? parentOf(id) != DEAD : workerOf(id) != DEAD_WORKER;
}

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
    + (<usize>resCap * REC) + (<usize>capOf(RES) << 2) + (<usize>wCap << 2) + 2 * DIR_BYTES
    + (<usize>listCap << 2) + (<usize>stackCap << 2) + (<usize>parentIdxCap << 2) + (<usize>cacheCap << 4);
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
