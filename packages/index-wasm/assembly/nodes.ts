// Tree nodes: one per block (a node is its whole prefix).
//
// Sequence identity: a node is (parent node, tokens hash); node 1 is the root (the empty prefix).
// Each node stores a 64-bit sequence hash seq = mixBijective(tokens hash ^ spread(parent's seq)) and the
// child table is keyed by it. A query can then compute every level's table address from the tokens
// alone, so the CPU overlaps the cache misses of successive levels instead of chaining them (the
// parent id is still compared, so matching stays exact); and the mix is a bijection, so the tokens
// hash is recovered from (seq, parent seq) for dumps instead of being stored twice.
import { CHUNK, CHUNK_BITS, CHUNK_MASK, DEAD, ID_MASK, MAX_NODE_ID, NIL, grow } from "./ids";
import { alloc } from "./pages";

// Nodes: 24-byte structs.
// 0 sequence hash u64 | 8 payload u64: the inline holder's block hash, or the worker mask of slots
// 0..63 (held, shared nodes) | 16 u32: parent (26 bits) | kind << 26 (2 bits) | inline copies << 28 (4 bits)
// | 20 u32: child count (20 bits) | inline holder's slot, or the shared node's record count, << 20.
// A free node has DEAD at 16 and the free-list link at 8. Mask words for slots >= 64 live in nMaskExt.
export const NODE: usize = 24;
export const KIND_NONE: u32 = 0;
export const KIND_INLINE: u32 = 1;
export const KIND_SHARED: u32 = 2;
export const INLINE_MAX_COPIES: u32 = 15;
const CHILD_BITS: u32 = 20;
export const CHILD_MAX: u32 = (1 << CHILD_BITS) - 1; // sticky: a node with this many children is never freed
export let nodeCap: u32 = 0;
export let nodeTop: u32 = 2;
export let nodeFree: u32 = NIL;
export let nodesLive: u32 = 0;
export let nodeDir: usize = 0;
export let maskWords: u32 = 1;  // 64-slot words per node; words past the first live in nMaskExt
export let nMaskExt: usize = 0; // u64 x (maskWords - 1) per node, for extCap nodes (rare: > 64 workers)
export let extCap: u32 = 0;

@inline export function nodeAt(n: u32): usize {
  return (<usize>load<u16>(nodeDir + (<usize>(n >> CHUNK_BITS) << 1)) << 16) + <usize>(n & CHUNK_MASK) * NODE;
}
@inline export function seqOf(n: u32): u64 { return load<u64>(nodeAt(n)); }
@inline export function parentOf(n: u32): u32 { return load<u32>(nodeAt(n), 16) & ID_MASK; }
@inline export function kindAt(p: usize): u32 { return (load<u32>(p, 16) >> 26) & 3; }
@inline export function inlineCopiesAt(p: usize): u32 { return load<u32>(p, 16) >> 28; }
@inline export function childCountAt(p: usize): u32 { return load<u32>(p, 20) & CHILD_MAX; }
@inline export function highAt(p: usize): u32 { return load<u32>(p, 20) >> CHILD_BITS; } // inline slot / shared record count
@inline export function setKindCopies(p: usize, kind: u32, copies: u32): void {
  store<u32>(p, (load<u32>(p, 16) & ID_MASK) | (kind << 26) | (copies << 28), 16);
}
@inline export function setHigh(p: usize, v: u32): void { store<u32>(p, (load<u32>(p, 20) & CHILD_MAX) | (v << CHILD_BITS), 20); }
@inline export function isDead(p: usize): bool { return load<u32>(p, 16) == DEAD; }

export const ROOT_SEQ: u64 = 0x243F6A8885A308D3;
const MIX_MUL: u64 = 0xD6E8FEB86659FD93;
const MIX_MUL_INVERSE: u64 = 0xCFEE444D8B59A89B; // MIX_MUL * this == 1 (mod 2^64)
@inline function spread(parentSeq: u64): u64 { return rotl<u64>(parentSeq, 23) * 0x9E3779B97F4A7C15; }
@inline export function mix(h: u64): u64 {
  h ^= h >> 32;
  h *= MIX_MUL;
  return h ^ (h >> 32);
}
@inline function unmix(h: u64): u64 {
  h ^= h >> 32;
  h *= MIX_MUL_INVERSE;
  return h ^ (h >> 32);
}
@inline export function childSeq(parentSeq: u64, tok: u64): u64 { return mix(tok ^ spread(parentSeq)); }
export function tokOf(n: u32): u64 { return unmix(seqOf(n)) ^ spread(seqOf(parentOf(n))); }

@inline export function maskExtAt(n: u32, word: u32): usize {
  return nMaskExt + ((<usize>n * (maskWords - 1) + word - 1) << 3);
}

/** Word 0 of the node's held-worker mask (slots 0..63). */
@inline export function mask0At(p: usize): u64 {
  const kind = kindAt(p);
  if (kind == KIND_SHARED) return load<u64>(p, 8);
  const s = highAt(p);
  return select<u64>(<u64>1 << (<u64>(s & 63)), 0, kind == KIND_INLINE && s < 64 && inlineCopiesAt(p) != 0);
}

@inline export function maskWord(n: u32, word: u32): u64 { return word == 0 ? mask0At(nodeAt(n)) : load<u64>(maskExtAt(n, word)); }

/** Whether worker w holds the node (at least one copy). */
export function holds(n: u32, w: u32): bool { return ((maskWord(n, w >> 6) >> (<u64>(w & 63))) & 1) != 0; }

/** Marks w as holding the node or not in the mask (the inline holder of slot < 64 is implied by its copies). */
export function setHeldBit(n: u32, w: u32, on: bool): void {
  const bit = <u64>1 << (<u64>(w & 63));
  let mp: usize;
  if (w >= 64) mp = maskExtAt(n, w >> 6);
  else {
    const p = nodeAt(n);
    if (kindAt(p) != KIND_SHARED) return;
    mp = p + 8;
  }
  store<u64>(mp, on ? load<u64>(mp) | bit : load<u64>(mp) & ~bit);
}

export function growNodes(): void {
  if (nodeCap + CHUNK - 1 > MAX_NODE_ID) unreachable(); // RES slots hold 25-bit node ids
  store<u16>(nodeDir + (<usize>(nodeCap >> CHUNK_BITS) << 1), <u16>(alloc(<usize>CHUNK * NODE) >> 16));
  nodeCap += CHUNK;
  if (maskWords > 1 && nodeCap > extCap) growMaskExt(nodeCap * 2);
}

function growMaskExt(cap: u32): void {
  const stride = <usize>(maskWords - 1) << 3;
  nMaskExt = grow(nMaskExt, <usize>extCap * stride, <usize>cap * stride);
  extCap = cap;
}
