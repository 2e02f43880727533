// The dump in the binary `/dump` layout (docs/CONTRACTS.md §7, "binary"): a worker's dumpWorker() rows
// written as whole stored events of little-endian u64 words, so a receiver copies them into its own
// linear memory and applies them without touching a block in JavaScript. Measured on the 10M-residency
// recovery bench: the JSON body was ~70 bytes per residency and most of the receiver's CPU went into
// reading it back; this is 16 bytes per residency and no conversion on either side.
//
// Event: header word (flags u32 | count u32 << 32; flags bit 0: a parent word follows, bit 1: count copy
// words follow the hashes), [parent block hash], count block hashes, count tokens hashes,
// [count copies]. Rows: see dump-json.ts.
import { ROW_BYTES, ROW_COPIES, ROW_FLAGS, ROW_HASH, ROW_HAS_PARENT, ROW_NEW_EVENT, ROW_PARENT, ROW_TOKENS } from "./dump-layout";

const EVENT_HAS_PARENT: u32 = 1;
const EVENT_HAS_COPIES: u32 = 2;

let binaryEnd: usize = 0;
let binaryNeed: usize = 0;
/** Where the last dumpBinary call stopped writing. */
export function dumpBinaryEnd(): usize { return binaryEnd; }
/** Bytes of the event that did not fit in the last dumpBinary call (0: the rows are all written). */
export function dumpBinaryNeed(): usize { return binaryNeed; }

/**
 * Writes the events of rows [pos, len) (pos at an event's first row) into [o, limit), whole events only,
 * as long as they fit; returns the row after the last event written.
 */
export function dumpBinary(rows: usize, len: u32, pos: u32, o: usize, limit: usize): u32 {
  binaryNeed = 0;
  while (pos < len) {
    const first = rows + <usize>pos * ROW_BYTES;
    let copies = load<u32>(first, ROW_COPIES) != 1;
    let end = pos + 1;
    while (end < len) {
      const r = rows + <usize>end * ROW_BYTES;
      if (load<u32>(r, ROW_FLAGS) & ROW_NEW_EVENT) break;
      if (load<u32>(r, ROW_COPIES) != 1) copies = true;
      end++;
    }
    const n = end - pos;
    const hasParent = (load<u32>(first, ROW_FLAGS) & ROW_HAS_PARENT) != 0;
    const bytes = <usize>(1 + (hasParent ? 1 : 0) + n * (copies ? 3 : 2)) << 3;
    if (o + bytes > limit) { binaryNeed = bytes; break; }
    store<u64>(o, <u64>((hasParent ? EVENT_HAS_PARENT : 0) | (copies ? EVENT_HAS_COPIES : 0)) | (<u64>n << 32));
    o += 8;
    if (hasParent) { store<u64>(o, load<u64>(first, ROW_PARENT)); o += 8; }
    const tok = o + (<usize>n << 3);
    const cp = tok + (<usize>n << 3);
    for (let i: u32 = 0; i < n; i++) {
      const r = first + <usize>i * ROW_BYTES;
      store<u64>(o + (<usize>i << 3), load<u64>(r, ROW_HASH));
      store<u64>(tok + (<usize>i << 3), load<u64>(r, ROW_TOKENS));
      if (copies) store<u64>(cp + (<usize>i << 3), <u64>load<u32>(r, ROW_COPIES));
    }
    o = copies ? cp + (<usize>n << 3) : cp;
    pos = end;
  }
  binaryEnd = o;
  return pos;
}
