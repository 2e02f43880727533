import { CHUNK, CHUNK_BITS, CHUNK_MASK, ID_MASK, MAX_REC_ID, NIL } from "./ids";
import { alloc } from "./pages";

// Shared records: a worker's (block hash, copies) at a node that more than one worker holds; 16-byte
// structs | 0 block hash u64 | 8 packed u64: node (26 bits) | worker
// slot << 26 (12 bits) | copies << 38 (26 bits). A free record has slot DEAD_WORKER and the free-list
// link in the node field. No per-node list: a record is reached through RES (worker, block hash), and
// a worker's records are found by scanning the chunks (clears, dumps).
export const REC: usize = 16;
export const DEAD_WORKER: u32 = 0xFFF;
export const REC_MAX_COPIES: u32 = (1 << 26) - 1;
export let resCap: u32 = 0;
export let resTop: u32 = 1;
let resFree: u32 = NIL;
export let resLive: u32 = 0; // residencies: (worker, block) pairs with at least one copy

@inline export function recAt(r: u32): usize {
  return (<usize>load<u16>(recDir + (<usize>(r >> CHUNK_BITS) << 1)) << 16) + (<usize>(r & CHUNK_MASK) << 4);
}
export let recDir: usize = 0;
@inline function packRec(node: u32, w: u32, copies: u32): u64 { return <u64>node | (<u64>w << 26) | (<u64>copies << 38); }
@inline export function recNode(r: u32): u32 { return <u32>load<u64>(recAt(r), 8) & ID_MASK; }
@inline export function recWorker(r: u32): u32 { return <u32>(load<u64>(recAt(r), 8) >> 26) & 0xFFF; }
@inline export function recCopies(r: u32): u32 { return <u32>(load<u64>(recAt(r), 8) >> 38); }
@inline export function setRecCopies(r: u32, c: u32): void {
  const rp = recAt(r);
  store<u64>(rp, (load<u64>(rp, 8) & ((<u64>1 << 38) - 1)) | (<u64>c << 38), 8);
}

export function growRes(): void {
  if (resCap + CHUNK - 1 > MAX_REC_ID) unreachable(); // RES slots hold 25-bit record ids
  store<u16>(recDir + (<usize>(resCap >> CHUNK_BITS) << 1), <u16>(alloc(<usize>CHUNK * REC) >> 16));
  resCap += CHUNK;
}

export function newRec(node: u32, w: u32, ext: u64, copies: u32): u32 {
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

export function freeRec(r: u32): void {
  store<u64>(recAt(r), packRec(resFree, DEAD_WORKER, 0), 8);
  resFree = r;
}
