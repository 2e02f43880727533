// The dump's shared layouts, declared once: this file is compiled into the module (assembly/dump-json.ts,
// assembly/dump-rows.ts) and imported by the TypeScript face (src/kv-index.ts), so both read and write the
// same offsets. Plain numeric constants only: it must stay valid AssemblyScript and TypeScript.

/** A dumpWorker row: parent block hash u64 | block hash u64 | tokens hash u64 | flags u32 | copies u32. */
export const ROW_BYTES = 32;
export const ROW_PARENT = 0;
export const ROW_HASH = 8;
export const ROW_TOKENS = 16;
export const ROW_FLAGS = 24;
export const ROW_COPIES = 28;
/** Row flags: the row starts a stored event; the event has a parent (ROW_PARENT is its hash). */
export const ROW_NEW_EVENT = 1;
export const ROW_HAS_PARENT = 2;

/**
 * The state of one dumpJson stream, owned by the caller, then that worker's prefix and suffix strings:
 * rows ptr u32 | rows len u32 | pos u32 | flags u32 | next event id u64 | prefix ptr u32 | prefix len u32 |
 * suffix ptr u32 | suffix len u32 (8 bytes to spare). Prefix = `{"worker_id":<json string>,"event":{"event_id":`,
 * suffix = `]}}},"dp_rank":<rank>}`.
 */
export const STATE_BYTES = 48;
export const STATE_ROWS = 0;
export const STATE_LEN = 4;
export const STATE_POS = 8;
export const STATE_FLAGS = 12;
export const STATE_EVENT_ID = 16;
export const STATE_PREFIX = 24;
export const STATE_PREFIX_LEN = 28;
export const STATE_SUFFIX = 32;
export const STATE_SUFFIX_LEN = 36;
/** State flags: inside an event (its suffix not yet written); an event was written (the next needs a comma). */
export const STATE_INSIDE = 1;
export const STATE_WROTE = 2;
