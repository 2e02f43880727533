// Applying events: stored, removed, cleared, as a batch from the builder or a binary dump run.
import { epoch } from "./dump-rows";
import { CHUNK_MASK, ID_MASK, NIL, RES_INLINE, ROOT } from "./ids";
import { KIND_INLINE, NODE, childCountAt, childSeq, highAt, inlineCopiesAt, isDead, kindAt, nodeAt, nodeTop, seqOf, setKindCopies } from "./nodes";
import { DEAD_WORKER, REC, REC_MAX_COPIES, recAt, recCopies, resTop, setRecCopies } from "./records";
import { addCopies, addRecord, becameHeld, deleteRecord, hasRecord, settle } from "./residency";
import { CHILD, RES, capOf, childFind, childMissUnderNew, homeOf, keyHash, resFind, resFindHashed, resId, resNode, slotsOf } from "./tables";
import { lastReject, outBlocks, outEvents, outRejected, outUnknown, totalRejected, totalUnknown } from "./tallies";
import { newNode } from "./tree";
import { ensureWorker, recsOfPtr, treeSizePtr } from "./workers";
import { zeroAdd } from "./zero-copy";

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
