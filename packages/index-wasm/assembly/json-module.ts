// Entry of the JSON body scanner's own module (build/json-scan.wasm): the scanner and a heap for its
// buffers, without the index (no tables or chunks set up for a module that only reads request bodies).
export { jsonScan } from "./json-scan";

export function reserve(bytes: usize): usize { return heap.alloc(bytes); }
export function release(p: usize, _bytes: usize): void { heap.free(p); }
