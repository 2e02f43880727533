// The fixed byte fragments of a RouterEvent in the JSON `/dump` body, declared once for its three writers
// and readers: recovery's TypeScript writer and parser, and the index module's writer (this file is compiled
// into index.wasm by index-wasm's assembly/dump-json.ts). Plain string constants only: it must stay valid
// AssemblyScript and TypeScript. The field names are DUMP_FIELDS' (a test checks they agree).
//
// An event: WORKER <worker id as a JSON string> EVENT_ID <n> PARENT <hash | null> BLOCKS, then its blocks
// separated by commas, each BLOCK <hash> TOKENS <hash> [COPIES <n>, when not 1] "}", then DP_RANK <rank> "}".

export const DUMP_JSON_WORKER = '{"worker_id":';
export const DUMP_JSON_EVENT_ID = ',"event":{"event_id":';
export const DUMP_JSON_PARENT = ',"data":{"stored":{"parent_hash":';
export const DUMP_JSON_BLOCKS = ',"blocks":[';
export const DUMP_JSON_BLOCK = '{"block_hash":';
export const DUMP_JSON_TOKENS = ',"tokens_hash":';
export const DUMP_JSON_COPIES = ',"copies":';
export const DUMP_JSON_DP_RANK = ']}}},"dp_rank":';
