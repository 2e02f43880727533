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

const NIL: u32 = 0;
const DEAD: u32 = 0xFFFFFFFF;
const ROOT: u32 = 1;
const EMPTY: u32 = 0;

// ---- growable raw arrays (TLSF heap of the minimal runtime: freed space is reused) ----
function grow(ptr: usize, oldBytes: usize, newBytes: usize): usize {
  const p = ptr == 0 ? heap.alloc(newBytes) : heap.realloc(ptr, newBytes);
  memory.fill(p + oldBytes, 0, newBytes - oldBytes);
  return p;
}
function zeroed(bytes: usize): usize {
  const p = heap.alloc(bytes);
  memory.fill(p, 0, bytes);
  return p;
}

// ---- nodes: array of 40-byte structs, so creating or visiting a node touches one cache line ----
// 0 sequence hash u64 | 8 worker mask for slots 0..63 u64 | 16 parent u32 | 20 first child u32
// 24 next sibling u32 (free-list link when free) | 28 previous sibling u32 | 32 residency list head u32
const NODE: usize = 40;
let nodeCap: u32 = 0;
let nodeTop: u32 = 2;
let nodeFree: u32 = NIL;
let nodesLive: u32 = 0;
let nodes: usize = 0;
let maskWords: u32 = 1;  // 64-slot words per node; words past the first live in nMaskExt
let nMaskExt: usize = 0; // u64 x (maskWords - 1) per node

@inline function nodeAt(n: u32): usize { return nodes + <usize>n * NODE; }
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
  const cap: u32 = nodeCap == 0 ? 1024 : nodeCap * 2;
  if (cap - 1 > MAX_ID) unreachable(); // table slots hold 26-bit ids
  nodes = grow(nodes, <usize>nodeCap * NODE, <usize>cap * NODE);
  if (maskWords > 1) nMaskExt = grow(nMaskExt, (<usize>nodeCap * (maskWords - 1)) << 3, (<usize>cap * (maskWords - 1)) << 3);
  nodeCap = cap;
}

function newNode(parent: u32, seq: u64): u32 {
  let id: u32;
  if (nodeFree != NIL) {
    id = nodeFree;
    nodeFree = nextOf(id);
  } else {
    if (nodeTop == nodeCap) growNodes();
    id = nodeTop++;
  }
  store<u64>(nodeAt(id), seq);
  store<u32>(nodeAt(id), parent, 16);
  setFirst(id, NIL);
  setRes(id, NIL);
  store<u64>(nodeAt(id), 0, 8);
  if (maskWords > 1) memory.fill(maskAt(id, 1), 0, <usize>(maskWords - 1) << 3);
  const head = firstOf(parent);
  setNext(id, head);
  setPrev(id, NIL);
  if (head != NIL) setPrev(head, id);
  setFirst(parent, id);
  tableInsert(CHILD, id);
  nodesLive++;
  return id;
}

function freeNode(id: u32): void {
  const prev = prevOf(id), next = nextOf(id);
  if (prev != NIL) setNext(prev, next); else setFirst(parentOf(id), next);
  if (next != NIL) setPrev(next, prev);
  tableDelete(CHILD, id);
  store<u32>(nodeAt(id), DEAD, 16); // parent: marks the slot free for table rebuilds
  setNext(id, nodeFree);
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
let recs: usize = 0;

@inline function recAt(r: u32): usize { return recs + <usize>r * REC; }
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
  const cap: u32 = resCap == 0 ? 1024 : resCap * 2;
  if (cap - 1 > MAX_ID) unreachable(); // table slots hold 26-bit ids
  recs = grow(recs, <usize>resCap * REC, <usize>cap * REC);
  resCap = cap;
}

// ---- two open-addressing tables (linear probing): CHILD maps (parent node, sequence hash) -> node,
// RES maps (worker, external hash) -> residency record. A slot is a u32: id in the low 26 bits, 6 hash
// bits above, so probing past foreign entries rarely dereferences them (measured: most of the cost of
// a miss was those loads). Deletion leaves a tombstone instead of shifting the cluster back, because
// the shift had to load every following entry to find its home (measured as most of the cost of a
// removal); tombstones are reused by inserts and swept by a rebuild once they reach a quarter of the
// table, which scans the node/record arrays sequentially.
const CHILD: i32 = 0;
const RES: i32 = 1;
const ID_BITS: u32 = 26;
const ID_MASK: u32 = (1 << ID_BITS) - 1;
const MAX_ID: u32 = ID_MASK - 1; // ID_MASK with all tag bits is the tombstone
const TOMB: u32 = 0xFFFFFFFF;
const TABLES: usize = memory.data(32, 8); // per table: slots ptr u32 | cap u32 | count u32 | tombstones u32

@inline function slotsOf(t: i32): usize { return <usize>load<u32>(TABLES + (<usize>t << 4)); }
@inline function capOf(t: i32): u32 { return load<u32>(TABLES + (<usize>t << 4), 4); }
@inline function countOf(t: i32): u32 { return load<u32>(TABLES + (<usize>t << 4), 8); }
@inline function setCount(t: i32, v: u32): void { store<u32>(TABLES + (<usize>t << 4), v, 8); }
@inline function tombsOf(t: i32): u32 { return load<u32>(TABLES + (<usize>t << 4), 12); }
@inline function setTombs(t: i32, v: u32): void { store<u32>(TABLES + (<usize>t << 4), v, 12); }

@inline function keyHash(a: u32, b: u64): u64 { return mix(b ^ (<u64>(a + 1) * 0x9E3779B97F4A7C15)); }
@inline function tagOf(h: u64): u32 { return <u32>(h >> 58) << ID_BITS; }

/** The hash of the entry with this id, read back from its node or record. */
@inline function hashOfId(t: i32, id: u32): u64 {
  return t == CHILD ? seqOf(id) : keyHash(workerOf(id), extOf(id));
}
@inline function matches(t: i32, id: u32, a: u32, b: u64): bool {
  return t == CHILD ? seqOf(id) == b && parentOf(id) == a : extOf(id) == b && workerOf(id) == a;
}

@inline function tableFind(t: i32, a: u32, b: u64): u32 {
  const slots = slotsOf(t), m = capOf(t) - 1;
  const h = t == CHILD ? b : keyHash(a, b), tag = tagOf(h);
  let i = <u32>h & m;
  while (true) {
    const v = load<u32>(slots + (<usize>i << 2));
    if (v == EMPTY) return NIL;
    if ((v & ~ID_MASK) == tag && v != TOMB && matches(t, v & ID_MASK, a, b)) return v & ID_MASK;
    i = (i + 1) & m;
  }
}

/** Puts an id whose key is absent into the first free or tombstone slot of its probe sequence. */
function tablePlace(slots: usize, m: u32, h: u64, id: u32): bool {
  let i = <u32>h & m;
  while (true) {
    const v = load<u32>(slots + (<usize>i << 2));
    if (v == EMPTY || v == TOMB) {
      store<u32>(slots + (<usize>i << 2), id | tagOf(h));
      return v == TOMB;
    }
    i = (i + 1) & m;
  }
}

function tableInit(t: i32, cap: u32): void {
  store<u32>(TABLES + (<usize>t << 4), <u32>zeroed(<usize>cap << 2));
  store<u32>(TABLES + (<usize>t << 4), cap, 4);
  setTombs(t, 0);
}

/** Indexes a node or record already written to its array (a rebuild picks it up from there). */
function tableInsert(t: i32, id: u32): void {
  if ((countOf(t) + tombsOf(t) + 1) * 4 > capOf(t) * 3) tableRebuild(t, countOf(t) + 1);
  else if (tablePlace(slotsOf(t), capOf(t) - 1, hashOfId(t, id), id)) setTombs(t, tombsOf(t) - 1);
  setCount(t, countOf(t) + 1);
}

function tableDelete(t: i32, id: u32): void {
  const slots = slotsOf(t), m = capOf(t) - 1;
  let i = <u32>hashOfId(t, id) & m;
  while ((load<u32>(slots + (<usize>i << 2)) & ID_MASK) != id) i = (i + 1) & m;
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
    const fresh = zeroed((<usize>nodeCap * (words - 1)) << 3);
    if (maskWords > 1) {
      for (let n: u32 = 0; n < nodeTop; n++) {
        memory.copy(fresh + ((<usize>n * (words - 1)) << 3), nMaskExt + ((<usize>n * (maskWords - 1)) << 3), <usize>(maskWords - 1) << 3);
      }
      heap.free(nMaskExt);
    }
    nMaskExt = fresh;
    maskWords = words;
    heap.free(scratchMask);
    scratchMask = zeroed(<usize>words << 3);
  }
}

@inline function treeSizePtr(w: u32): usize { return wCount + (<usize>w << 2); }

function addResidency(w: u32, node: u32, ext: u64): void {
  let r: u32;
  if (resFree != NIL) {
    r = resFree;
    resFree = nextRes(r);
  } else {
    if (resTop == resCap) growRes();
    r = resTop++;
  }
  const rp = recAt(r);
  store<u64>(rp, ext);
  store<u64>(rp, pack(node, resOf(node), w), 8);
  setRes(node, r);
  tableInsert(RES, r);
  const mp = maskAt(node, w >> 6);
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

function dropResidency(node: u32, w: u32): void {
  let prev: u32 = NIL;
  let r = resOf(node);
  while (workerOf(r) != w) { prev = r; r = nextRes(r); }
  if (prev == NIL) setRes(node, nextRes(r)); else setNextRes(prev, nextRes(r));
  tableDelete(RES, r);
  store<u64>(recAt(r), pack(0, resFree, DEAD_WORKER), 8); // marks the slot free for table rebuilds
  resFree = r;
  resLive--;
  const mp = maskAt(node, w >> 6);
  store<u64>(mp, load<u64>(mp) & ~(<u64>1 << (<u64>(w & 63))));
  store<u32>(treeSizePtr(w), load<u32>(treeSizePtr(w)) - 1);
  if (resOf(node) == NIL) freeNode(node);
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

function stored(w: u32, hasParent: bool, parentExt: u64, p: usize, n: u32): void {
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
  for (let i: u32 = 0; i < n; i++) {
    const ext = load<u64>(p + (<usize>i << 4));
    const tok = load<u64>(p + (<usize>i << 4) + 8);
    seq = childSeq(seq, tok);
    const held = tableFind(RES, w, ext);
    let child = tableFind(CHILD, cur, seq);
    if (held != NIL || (child != NIL && holds(child, w))) {
      if (held != NIL && nodeOfRes(held) == child) { cur = child; continue; } // idempotent re-store
      lastReject = 2; outRejected++; totalRejected++;
      return;
    }
    if (child == NIL) child = newNode(cur, seq);
    addResidency(w, child, ext);
    outBlocks++;
    cur = child;
  }
}

function removed(w: u32, p: usize, n: u32): void {
  for (let i: u32 = 0; i < n; i++) {
    const r = tableFind(RES, w, load<u64>(p + (<usize>i << 3)));
    if (r == NIL) { outUnknown++; totalUnknown++; continue; }
    outBlocks += dropSubtree(nodeOfRes(r), w);
  }
}

export function clearWorker(w: u32): u32 {
  ensureWorker(w);
  return dropSubtree(ROOT, w);
}

/**
 * Applies encoded events from linear memory. Each event starts with a header word
 * kind | worker << 8 | count << 32 (kind 1 stored at the root, 2 stored under the parent hash in the
 * next word, 3 removed, 4 cleared), then `count` (external hash, tokens hash) pairs (stored) or
 * `count` external hashes (removed). Returns the words consumed; tallies are read with the getters.
 */
export function applyBatch(p: usize, words: u32): u32 {
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
    if (kind == 1 || kind == 2) {
      let parent: u64 = 0;
      if (kind == 2) { parent = load<u64>(p + (<usize>i << 3)); i++; }
      stored(w, kind == 2, parent, p + (<usize>i << 3), n);
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

export function treeSizes(): usize { return wCount; }
export function workerCapacity(): u32 { return wCap; }

/**
 * Copies the worker's residencies, parents before children, as (parent external hash, external hash,
 * tokens hash, has-parent) u64 quadruples into a fresh buffer; the caller frees it with release().
 * Depth-first order keeps each single-child chain contiguous.
 */
export function dumpWorker(w: u32): usize {
  ensureWorker(w);
  collect(ROOT, w);
  const out = heap.alloc(<usize>max<u32>(listLen, 1) << 5);
  for (let i: u32 = 0; i < listLen; i++) {
    const n = load<u32>(listPtr + (<usize>i << 2));
    const parent = parentOf(n);
    const o = out + (<usize>i << 5);
    store<u64>(o, parent == ROOT ? 0 : extOf(recordAt(parent, w)));
    store<u64>(o + 8, extOf(recordAt(n, w)));
    store<u64>(o + 16, tokOf(n));
    store<u64>(o + 24, parent == ROOT ? 0 : 1);
  }
  return out;
}
export function dumpLength(): u32 { return listLen; }

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
  if (entries * 4 > capOf(t) * 3) tableRebuild(t, entries);
}

/**
 * Rebuilds a table (dropping tombstones) at the smallest power-of-two size that keeps `entries` under
 * 5/8 load (so at least 1/8 of the table absorbs tombstones before the next rebuild), from the node/record arrays in id order rather than from the old slots: the key reads are
 * then sequential instead of one cache miss per entry.
 */
function tableRebuild(t: i32, entries: u32): void {
  let cap: u32 = 1024;
  while (entries * 8 > cap * 5) cap *= 2;
  if (cap < capOf(t)) cap = capOf(t); // never shrink: steady churn keeps its footprint
  heap.free(slotsOf(t));
  tableInit(t, cap);
  const slots = slotsOf(t), m = cap - 1;
  if (t == CHILD) {
    for (let id: u32 = 2; id < nodeTop; id++) {
      if (parentOf(id) != DEAD) tablePlace(slots, m, seqOf(id), id);
    }
  } else {
    for (let id: u32 = 1; id < resTop; id++) {
      if (workerOf(id) != DEAD_WORKER) tablePlace(slots, m, keyHash(workerOf(id), extOf(id)), id);
    }
  }
}

// ---- I/O buffers and stats ----
export function reserve(bytes: usize): usize { return heap.alloc(bytes); }
export function release(p: usize): void { heap.free(p); }

export function blocks(): u32 { return nodesLive; }
export function residencies(): u32 { return resLive; }
export function rejectedTotal(): u64 { return totalRejected; }
export function unknownTotal(): u64 { return totalUnknown; }
export function bytesInUse(): usize {
  return (<usize>nodeCap * (NODE + 8 * (maskWords - 1))) + (<usize>capOf(CHILD) << 2)
    + (<usize>resCap * REC) + (<usize>capOf(RES) << 2) + (<usize>wCap << 2)
    + (<usize>listCap << 2) + (<usize>stackCap << 2);
}

/** XXH3-64 (seed) of each full block of `blockSize` u32 token ids at `tokens`; returns the block count. */
export function computeBlockHashes(tokens: usize, nTokens: u32, blockSize: u32, seed: u64, out: usize): u32 {
  const n = nTokens / blockSize;
  const len = <usize>blockSize << 2;
  for (let i: u32 = 0; i < n; i++) store<u64>(out + (<usize>i << 3), xxh3(tokens + <usize>i * len, len, seed));
  return n;
}

export function hashBytes(p: usize, len: usize, seed: u64): u64 { return xxh3(p, len, seed); }

function init(): void {
  growNodes();
  growRes();
  tableInit(CHILD, 1024);
  tableInit(RES, 1024);
  scratchMask = zeroed(8);
  ensureWorker(0);
  // the root: never freed, no parent, not in the child index
  store<u64>(nodeAt(ROOT), ROOT_SEQ);
  nodeTop = 2;
}
init();
