// Worker slots: per-slot residency and record counts, and the width of the node masks.
import { grow, zeroed } from "./ids";
import { extCap, maskWords, nMaskExt, nodeCap, nodeTop } from "./nodes";
import { free } from "./pages";

export let wCap: u32 = 0;
export let wCount: usize = 0; // u32 residencies per worker slot (its tree size)
let wRecs: usize = 0; // u32 records per worker slot (residencies and zero-copy records)
export let scratchMask: usize = 0;

export function ensureWorker(w: u32): void {
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

@inline export function treeSizePtr(w: u32): usize { return wCount + (<usize>w << 2); }
@inline export function recsOfPtr(w: u32): usize { return wRecs + (<usize>w << 2); }
@inline export function bumpTree(w: u32, d: i32): void { store<u32>(treeSizePtr(w), load<u32>(treeSizePtr(w)) + d); }
