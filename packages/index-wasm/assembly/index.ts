// The KV index module's entry: the exports the TypeScript face (src/kv-index.ts) calls, the stats, and
// start-up. The index itself is in the files below, one structure or job each (README "Module map"):
//   ids.ts           sentinel ids, the 26-bit id layout, the chunk directory
//   nodes.ts         tree nodes (a block = its whole prefix), sequence hashes, holder masks
//   tree.ts          adding a node under its parent, freeing it
//   records.ts       shared records: (block hash, copies) of a worker at a node held by several
//   tables.ts        the CHILD and RES hash tables: find, insert after a miss, delete
//   table-growth.ts  presize, reserve, and the rebuild that grows or sweeps a table
//   zero-copy.ts     the zero-copy records of each node (kept to name a prefix)
//   workers.ts       worker slots: residency and record counts, mask width
//   residency.ts     a worker's record at a node: add, add copies, delete, settle the node
//   events.ts        stored / removed / cleared events, the builder's batches, binary dump runs
//   tallies.ts       what the last batch did, totals since start
//   matches.ts       findMatches: leading blocks held per worker
//   dump-rows.ts     a worker's blocks as dump rows, parents first; dump-json.ts and dump-binary.ts write them
//   block-hash.ts    XXH3-64 of blocks for the wrapper
//   pages.ts         linear memory: whole pages for large blocks, TLSF for small ones
import { initJson } from "./dump-json";
import { groupCap, groupStartCap } from "./dump-rows";
import { DIR_BYTES, NIL, ROOT, zeroed } from "./ids";
import { NODE, ROOT_SEQ, extCap, growNodes, maskWords, nodeAt, nodeCap, nodeDir, nodeTop, nodesLive } from "./nodes";
import { alloc, free, freePages } from "./pages";
import { REC, growRes, recAt, recDir, resCap, resLive } from "./records";
import { listCap } from "./residency";
import { CHILD, MIN_TABLE, RES, capOf, tableInit } from "./tables";
import { ensureWorker, scratchMask, wCap } from "./workers";
import { zeroCap } from "./zero-copy";

export { applyBatch, applyDump, clearWorker } from "./events";
export { batchBlocks, batchEvents, batchRejected, batchUnknown, lastRejectReason, rejectedTotal, unknownTotal } from "./tallies";
export { findMatches, treeSizes, workerCapacity } from "./matches";
export { dumpCacheRelease, dumpLength, dumpWorker } from "./dump-rows";
export { presize, reserveTables, tableRebuilds } from "./table-growth";
export { computeBlockHashes, computeBlockHashesExtra, hashBytes } from "./block-hash";
export { dumpJson } from "./dump-json";
export { dumpBinary, dumpBinaryEnd, dumpBinaryNeed } from "./dump-binary";

// I/O buffers and stats
export function reserve(bytes: usize): usize { return alloc(bytes); }
/** Frees a block from reserve() or dumpWorker(); `bytes` is the size it was reserved with. */
export function release(p: usize, bytes: usize): void { free(p, bytes); }
export function freeBytes(): usize { return <usize>freePages() << 16; }

export function blocks(): u32 { return nodesLive; }
export function residencies(): u32 { return resLive; }
export function bytesInUse(): usize {
  return (<usize>nodeCap * NODE) + (<usize>extCap * 8 * (maskWords - 1)) + (<usize>capOf(CHILD) << 2)
    + (<usize>resCap * REC) + (<usize>capOf(RES) << 2) + (<usize>wCap << 3) + 2 * DIR_BYTES
    + (<usize>listCap << 2) + (<usize>zeroCap << 3) + (<usize>groupCap << 4) + (<usize>groupStartCap << 2);
}

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
