// Ids and the chunk directory shared by every structure of the index: sentinel node ids, the 26-bit id
// layout table slots hold, the size of a chunk, and two allocation shorthands over pages.ts.
import { allocZeroed, regrow } from "./pages";

export const NIL: u32 = 0;
export const DEAD: u32 = 0xFFFFFFFF;
export const ROOT: u32 = 1;
export const EMPTY: u32 = 0;

@inline export function grow(ptr: usize, oldBytes: usize, newBytes: usize): usize { return regrow(ptr, oldBytes, newBytes); }
@inline export function zeroed(bytes: usize): usize { return allocZeroed(bytes); }

// Table slots hold 26-bit ids (6 tag bits above). In RES the id's top bit tells a node (its inline
// holder) from a shared record, so both have 25-bit ids: an index holds fewer than 2^25 - 8192 blocks
// and 2^25 shared records.
export const ID_BITS: u32 = 26;
export const ID_MASK: u32 = (1 << ID_BITS) - 1;
export const RES_INLINE: u32 = 1 << (ID_BITS - 1);
export const RES_ID_MASK: u32 = RES_INLINE - 1;
export const MAX_NODE_ID: u32 = RES_ID_MASK - 1; // RES_ID_MASK | RES_INLINE with all tag bits is the tombstone
export const MAX_REC_ID: u32 = RES_ID_MASK;

// Chunked arrays: nodes and records live in fixed chunks of 8192 (whole pages: 192 KiB of nodes,
// 128 KiB of records) behind a directory holding each chunk's first page as a u16. Chunks never move,
// growth is one chunk at a time, and chunks fill the runs freed tables leave (measured: arrays that
// doubled through realloc left their old copies in linear memory, ~2x the live structures).
export const CHUNK_BITS: u32 = 13;
export const CHUNK: u32 = 1 << CHUNK_BITS;
export const CHUNK_MASK: u32 = CHUNK - 1;
export const DIR_BYTES: usize = (<usize>1 << (ID_BITS - CHUNK_BITS)) << 1;
