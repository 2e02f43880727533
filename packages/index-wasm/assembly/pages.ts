// Memory for the index: large blocks in whole 64 KiB pages straight from memory.grow, small ones from
// the minimal runtime's TLSF heap.
//
// Why not TLSF for everything: when TLSF runs out it grows linear memory by max(current size, needed),
// i.e. it doubles the whole memory. Measured: 50 B of linear memory per residency at 1M residencies for
// 30 B of live structures. Here memory grows by exactly the pages asked for; freed runs (old tables,
// old scratch buffers) go on a sorted first-fit list, merged with their neighbours, and are reused by
// the next large block (node/record chunks, grown tables). TLSF is given a small pool up front and only
// serves blocks under SMALL, so it never has to grow past it (and never doubles a large memory).

const PAGE_BITS: u32 = 16;
const SMALL: usize = 8192;
const SMALL_POOL: usize = 128 * 1024;
const MAX_RUNS: u32 = 1024;
const RUNS: usize = memory.data(<i32>(MAX_RUNS * 8), 8); // free runs: first page u32 | pages u32, by first page

let runCount: u32 = 0;
let ready = false;
// Where the pages of the last takePages() that came straight from memory.grow begin: those are zero
// already (memory never shrinks, so a page below the old end has been used), and allocZeroed / regrow
// skip them.
let freshFrom: usize = 0;

@inline function runAt(i: u32): usize { return RUNS + (<usize>i << 3); }

export function pagesFor(bytes: usize): u32 { return <u32>((bytes + 0xFFFF) >> PAGE_BITS); }

/**
 * Makes sure a run of `pages` free pages exists, growing memory by what the run at its end lacks;
 * false, with nothing changed, if the host refuses to grow it. An operation that would rather fail
 * than trap halfway (a reservation) asks first; its allocations then come from free runs.
 */
export function ensureFreeRun(pages: u32): bool {
  if (!ready) setUp();
  if (firstFit(pages) >= 0) return true;
  const end = <u32>memory.size();
  const tail = tailPages(end);
  if (tail == 0 && runCount == MAX_RUNS) return false; // no room to record the run (pathological fragmentation)
  if (memory.grow(<i32>(pages - tail)) < 0) return false;
  givePages(end, pages - tail); // merges with the tail run
  return true;
}

/** The first free run of at least `pages` pages, or -1. */
function firstFit(pages: u32): i32 {
  for (let i: u32 = 0; i < runCount; i++) if (load<u32>(runAt(i), 4) >= pages) return <i32>i;
  return -1;
}

/** Pages of the free run that ends where memory ends (the last run, when it does), else 0. */
function tailPages(end: u32): u32 {
  if (runCount == 0) return 0;
  const start = load<u32>(runAt(runCount - 1)), n = load<u32>(runAt(runCount - 1), 4);
  return start + n == end ? n : 0;
}

/** TLSF must take its pool before the first page is grown, or its initialisation would claim those pages. */
function setUp(): void {
  ready = true;
  heap.free(heap.alloc(SMALL_POOL));
}

function takePages(pages: u32): usize {
  freshFrom = usize.MAX_VALUE;
  const fit = firstFit(pages);
  if (fit >= 0) {
    const i = <u32>fit;
    const start = load<u32>(runAt(i)), n = load<u32>(runAt(i), 4);
    if (n == pages) {
      memory.copy(runAt(i), runAt(i + 1), <usize>(runCount - i - 1) << 3);
      runCount--;
    } else {
      store<u32>(runAt(i), start + pages);
      store<u32>(runAt(i), n - pages, 4);
    }
    return <usize>start << PAGE_BITS;
  }
  const end = <u32>memory.size();
  // a free run that ends at the end of memory only needs the difference grown
  const tail = tailPages(end);
  if (memory.grow(<i32>(pages - tail)) < 0) unreachable();
  if (tail > 0) runCount--;
  freshFrom = <usize>end << PAGE_BITS;
  return <usize>(end - tail) << PAGE_BITS;
}

function givePages(start: u32, pages: u32): void {
  let i: u32 = 0;
  while (i < runCount && load<u32>(runAt(i)) < start) i++;
  // merge with the run before and/or after
  if (i > 0 && load<u32>(runAt(i - 1)) + load<u32>(runAt(i - 1), 4) == start) {
    store<u32>(runAt(i - 1), load<u32>(runAt(i - 1), 4) + pages, 4);
    if (i < runCount && start + pages == load<u32>(runAt(i))) {
      store<u32>(runAt(i - 1), load<u32>(runAt(i - 1), 4) + load<u32>(runAt(i), 4), 4);
      memory.copy(runAt(i), runAt(i + 1), <usize>(runCount - i - 1) << 3);
      runCount--;
    }
    return;
  }
  if (i < runCount && start + pages == load<u32>(runAt(i))) {
    store<u32>(runAt(i), start);
    store<u32>(runAt(i), load<u32>(runAt(i), 4) + pages, 4);
    return;
  }
  if (runCount == MAX_RUNS) return; // pathological fragmentation: leave the run unused rather than fail
  memory.copy(runAt(i + 1), runAt(i), <usize>(runCount - i) << 3);
  store<u32>(runAt(i), start);
  store<u32>(runAt(i), pages, 4);
  runCount++;
}

/** `bytes` of uninitialised memory; blocks of SMALL bytes or more are page-aligned. */
export function alloc(bytes: usize): usize {
  if (!ready) setUp();
  return bytes < SMALL ? heap.alloc(bytes) : takePages(pagesFor(bytes));
}

/** Frees a block from alloc; `bytes` must be the size it was allocated with. */
export function free(p: usize, bytes: usize): void {
  if (p == 0) return;
  if (bytes < SMALL) heap.free(p);
  else givePages(<u32>(p >> PAGE_BITS), pagesFor(bytes));
}

/** Bytes a block of this size really occupies (whole pages for large blocks), so callers can use them. */
export function usable(bytes: usize): usize {
  return bytes < SMALL ? bytes : <usize>pagesFor(bytes) << PAGE_BITS;
}

export function allocZeroed(bytes: usize): usize {
  const p = alloc(bytes);
  zeroUnlessFresh(p, bytes);
  return p;
}

/** Zeroes [p, p + bytes) of the block alloc() just returned, except pages fresh from memory.grow. */
@inline function zeroUnlessFresh(p: usize, bytes: usize): void {
  const end = bytes < SMALL ? p + bytes : min<usize>(p + bytes, freshFrom);
  if (end > p) memory.fill(p, 0, end - p);
  touchFresh(end, p + bytes);
}

/**
 * Writes a zero into every OS page of fresh memory in [from, to): a page first read (a table probed
 * before anything is stored in it) is mapped to the kernel's zero page and faults again on the first
 * write; written first, it faults once. Measured: 11.3k faults against 7.1k for one ingestion run.
 */
function touchFresh(from: usize, to: usize): void {
  for (let q = from; q < to; q += 4096) store<u8>(q, 0);
}

/** Moves a block to a larger size, zero-filling the new part. */
export function regrow(p: usize, oldBytes: usize, newBytes: usize): usize {
  const q = alloc(newBytes);
  const fresh = freshFrom; // free() below does not take pages, but read it before anything else can
  if (p != 0) {
    memory.copy(q, p, oldBytes);
    free(p, oldBytes);
  }
  const start = q + oldBytes, end = newBytes < SMALL ? q + newBytes : max<usize>(start, min<usize>(q + newBytes, fresh));
  if (end > start) memory.fill(start, 0, end - start);
  touchFresh(end, q + newBytes);
  return q;
}

/** Free pages held for reuse (stats). */
export function freePages(): u32 {
  let n: u32 = 0;
  for (let i: u32 = 0; i < runCount; i++) n += load<u32>(runAt(i), 4);
  return n;
}
