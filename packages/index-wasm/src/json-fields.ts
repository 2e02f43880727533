// Top-level fields of a JSON object read in WebAssembly (assembly/json-scan.ts): the whole text is
// validated, and an array of plain unsigned integers under a wanted key comes back as a Uint32Array
// without a JS array or string ever being built. For the EPP's request bodies, where JSON.parse of an
// 8k-token prompt was the largest cost of a decision.
import { instantiateAt, jsonWasmPath, ScratchRegion, type Buffers } from "./wasm-module.ts";

/** The scanner's own module (assembly/json-module.ts): no index in it. */
type JsonExports = Buffers & {
  memory: WebAssembly.Memory;
  jsonScan(p: number, len: number, keys: number, nKeys: number, info: number, out: number): number;
};

export type JsonField =
  | { kind: "absent" }
  /** `start`/`end`: byte offsets of the value in the text (a string's include its quotes). */
  | { kind: "string"; start: number; end: number }
  | { kind: "uints"; start: number; end: number; values: Uint32Array }
  | { kind: "other"; start: number; end: number };

const KIND = ["absent", "string", "uints", "other"] as const;
const KEY_INFO_WORDS = 5;
const ABSENT: JsonField = { kind: "absent" };

export class JsonFieldScanner {
  private readonly ex: JsonExports;
  private readonly keys: number;
  private readonly info: number;
  private readonly count: number;
  private readonly text: ScratchRegion;
  private readonly out: ScratchRegion;

  /** `keys`: the top-level keys whose values are wanted (plain keys, compared byte for byte). */
  constructor(keys: readonly string[]) {
    this.ex = instantiateAt<JsonExports>(jsonWasmPath);
    const enc = new TextEncoder();
    const bytes = keys.map((k) => enc.encode(k));
    const table = keys.length * 8;
    const size = table + bytes.reduce((n, b) => n + b.length, 0);
    this.keys = this.ex.reserve(Math.max(size, 8));
    const view = new DataView(this.ex.memory.buffer);
    let off = table;
    bytes.forEach((b, i) => {
      view.setUint32(this.keys + i * 8, off, true);
      view.setUint32(this.keys + i * 8 + 4, b.length, true);
      new Uint8Array(this.ex.memory.buffer, this.keys + off, b.length).set(b);
      off += b.length;
    });
    this.count = keys.length;
    this.info = this.ex.reserve(Math.max(keys.length * KEY_INFO_WORDS * 4, 4));
    this.text = new ScratchRegion(this.ex);
    this.out = new ScratchRegion(this.ex);
  }

  /**
   * The wanted keys' values, in the order the keys were given; null when the text is not a single JSON
   * object, or is one the scanner leaves to JSON.parse (nesting deeper than 256, a top-level key written
   * with escapes, a wanted key given twice). Null never means valid JSON was misread: parse it then.
   */
  scan(json: Uint8Array): JsonField[] | null {
    const ex = this.ex;
    const text = this.text.ensure(json.length + 8); // jsonScan writes 8 zero bytes after the text
    const out = this.out.ensure(((json.length >> 1) + 1) * 4);
    new Uint8Array(ex.memory.buffer, text, json.length).set(json);
    if (ex.jsonScan(text, json.length, this.keys, this.count, this.info, out) !== 1) return null;
    const info = new Uint32Array(ex.memory.buffer, this.info, this.count * KEY_INFO_WORDS);
    const fields: JsonField[] = [];
    for (let i = 0; i < this.count; i++) {
      const w = i * KEY_INFO_WORDS;
      const kind = KIND[info[w]!]!;
      const start = info[w + 1]!;
      const end = info[w + 2]!;
      if (kind === "absent") fields.push(ABSENT);
      else if (kind === "uints") fields.push({ kind, start, end, values: new Uint32Array(ex.memory.buffer, out + info[w + 3]! * 4, info[w + 4]!).slice() });
      else fields.push({ kind, start, end });
    }
    return fields;
  }
}
