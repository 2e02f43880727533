// @kv-epp/index-wasm/json: the request-body JSON scanner, its own WebAssembly module beside the index's
// (not part of the index's face; the EPP's ext_proc reads token-id bodies with it).
export { JsonFieldScanner, type JsonField } from "./json-fields.ts";
