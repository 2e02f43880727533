// Matching: the workers that hold a query's leading blocks, and how many.
import { NIL, ROOT } from "./ids";
import { ROOT_SEQ, childSeq, mask0At, maskWord, maskWords, nodeAt } from "./nodes";
import { childFind } from "./tables";
import { scratchMask, wCap, wCount } from "./workers";


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
