// A worker's record at a node: adding, adding copies, deleting, and settling the node afterwards.
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
import { NIL, RES_INLINE, ROOT, grow } from "./ids";
import { INLINE_MAX_COPIES, KIND_INLINE, KIND_NONE, KIND_SHARED, childCountAt, highAt, holds, inlineCopiesAt, kindAt, mix, nodeAt, setHeldBit, setHigh, setKindCopies } from "./nodes";
import { REC_MAX_COPIES, freeRec, newRec, recAt, recCopies, recWorker, resLive, setRecCopies } from "./records";
import { resInsertAfterMiss } from "./table-growth";
import { RES, homeOf, keyHash, nextSlot, resId, resRepoint, tableDeleteAt } from "./tables";
import { outBlocks } from "./tallies";
import { freeNode } from "./tree";
import { bumpTree, recsOfPtr } from "./workers";
import { ZERO_TOMB, zeroAdd, zeroCap, zeroCount, zeroDel, zeroFind, zeroSlots } from "./zero-copy";

/** Counts a record's move between zero and some copies (mask bit, tree size, totals). */
@inline export function becameHeld(n: u32, w: u32, held: bool): void {
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
@inline export function addRecord(w: u32, n: u32, ext: u64, copies: u32): void {
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
export function addCopies(v: u32, w: u32, n: u32, copies: u32): void {
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
export function deleteRecord(v: u32, w: u32, n: u32): void {
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
export function settle(n: u32): void {
  while (n != ROOT) {
    const p = nodeAt(n);
    if (childCountAt(p) != 0) return;
    purgeZeroCopies(n);
    if (kindAt(p) != KIND_NONE) return;
    n = freeNode(n);
  }
}

/** Whether w has a record (any copies) at node n. */
export function hasRecord(n: u32, w: u32): bool {
  const p = nodeAt(n);
  const kind = kindAt(p);
  if (kind == KIND_INLINE) return highAt(p) == w;
  if (kind == KIND_NONE) return false;
  return holds(n, w) || zeroFind(n, w) != NIL;
}

// Traversal scratch: a list purgeZeroCopies collects into before it deletes.
let listPtr: usize = 0;
export let listCap: u32 = 0;
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
