// The zero-copy shared records of each node (records kept, without copies, to name a prefix).
import { NIL, zeroed } from "./ids";
import { mix } from "./nodes";
import { free } from "./pages";
import { recWorker } from "./records";
import { homeOf, nextSlot } from "./tables";

// Zero-copy shared records by node: a small open-addressing table of (node | record << 32), so a
// node left without children finds them (inline ones are the node itself). Rare: vLLM evicts leaves
// first, so a block whose last copy goes usually has no children.
export let zeroSlots: usize = 0;
export let zeroCap: u32 = 0;
export let zeroCount: u32 = 0;
let zeroTombs: u32 = 0;
export const ZERO_TOMB: u64 = 0xFFFFFFFFFFFFFFFF;

export function zeroAdd(n: u32, r: u32): void {
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

export function zeroDel(n: u32, r: u32): void {
  const want = <u64>n | (<u64>r << 32);
  let i = homeOf(mix(<u64>n), zeroCap);
  while (load<u64>(zeroSlots + (<usize>i << 3)) != want) i = nextSlot(i, zeroCap);
  store<u64>(zeroSlots + (<usize>i << 3), ZERO_TOMB);
  zeroCount--;
  zeroTombs++;
}

/** A zero-copy shared record of worker w at node n, or NIL. */
export function zeroFind(n: u32, w: u32): u32 {
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
