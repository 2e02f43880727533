import type { RouterEvent } from "@kv-epp/protocol";
import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { type DumpBatch, DumpFormatError, DumpParser, dumpStream, readDump } from "../src/index.ts";
import { MapIndex, type ModelDump, readAll, sampleIndex } from "./helpers.ts";

const enc = new TextEncoder();

/** `typed`: through the parser's typed batches (tiny batches, so events cross batch boundaries), back to objects. */
function parseAll(body: Uint8Array | string, chunkSize = Infinity, limits = {}, typed = false): ModelDump[] {
  const bytes = typeof body === "string" ? enc.encode(body) : body;
  const out: ModelDump[] = [];
  const add = (key: string, blockSize: number, e: RouterEvent) => {
    let m = out.find((x) => x.key === key);
    if (!m) out.push((m = { key, blockSize, events: [] }));
    m.events.push(e);
  };
  const batch = typed
    ? { sink: (key: string, blockSize: number, b: DumpBatch) => { for (let i = 0; i < b.count; i++) add(key, blockSize, b.event(i)); }, events: 3, blocks: 5 }
    : undefined;
  const p = new DumpParser(add, limits, batch);
  for (let i = 0; i < bytes.length; i += Math.min(chunkSize, bytes.length)) p.push(bytes.subarray(i, i + chunkSize));
  p.end();
  return out;
}

const U64_MAX = 0xffff_ffff_ffff_ffffn;

describe("/dump writer", () => {
  test("emits the contract's /dump shape with exact integers", async () => {
    const idx = new MapIndex([
      {
        key: "m:default",
        blockSize: 16,
        events: [{ workerId: "w-1", dpRank: 1, eventId: 7, parentHash: null, blocks: [{ blockHash: U64_MAX, tokensHash: 1n << 63n }] }],
      },
    ]);
    const text = new TextDecoder().decode(await readAll(dumpStream(idx)));
    expect(text).toBe(
      '{"m:default":{"block_size":16,"events":[{"worker_id":"w-1","event":{"event_id":7,"data":{"stored":{"parent_hash":null,' +
        '"blocks":[{"block_hash":18446744073709551615,"tokens_hash":9223372036854775808}]}}},"dp_rank":1}]}}',
    );
  });

  test("an empty index is an empty object", async () => {
    expect(new TextDecoder().decode(await readAll(dumpStream(new MapIndex())))).toBe("{}");
  });

  test("is pulled lazily: nothing is iterated beyond what the reader asked for", async () => {
    let produced = 0;
    const events = function* (): Generator<RouterEvent> {
      for (let i = 0; i < 1_000_000; i++) {
        produced++;
        yield { workerId: "w", dpRank: 0, eventId: i, parentHash: BigInt(i), blocks: [{ blockHash: BigInt(i), tokensHash: 2n }] };
      }
    };
    const stream = dumpStream({ models: () => [{ key: "m", blockSize: 16, events: events() }] }, { chunkBytes: 4096 });
    const reader = stream.getReader();
    await reader.read();
    await reader.read();
    await Bun.sleep(5);
    // Two chunks read, at most one more buffered (high-water mark 1): a few hundred events, not a million.
    expect(produced).toBeLessThan(1000);
    await reader.cancel();
  });
});

for (const typed of [false, true]) describe(`/dump parser (${typed ? "typed batches" : "objects"})`, () => {
  const parse = (body: Uint8Array | string, chunkSize?: number, limits?: object) => parseAll(body, chunkSize, limits, typed);
  test("u64 values >= 2^63 round-trip exactly through writer and parser", async () => {
    const hashes = [0n, 1n, 9n, 10n, 99_999n, 100_000n, 99_999_999n, 100_000_000n, 4_294_967_295n, 4_294_967_296n, 10n ** 16n - 1n, 10n ** 16n, 10n ** 19n - 1n, 10n ** 19n, (1n << 53n) + 1n, (1n << 63n) - 1n, 1n << 63n, (1n << 63n) + 12345n, U64_MAX - 1n, U64_MAX];
    const events: RouterEvent[] = hashes.map((h, i) => ({ workerId: "w", dpRank: 0, eventId: i, parentHash: h, blocks: [{ blockHash: h, tokensHash: U64_MAX - h }] }));
    const body = await readAll(dumpStream(new MapIndex([{ key: "m:t", blockSize: 16, events }])));
    expect(parse(body)).toEqual([{ key: "m:t", blockSize: 16, events }]);
    // JSON.parse would have lost these: the point of writing our own tokenizer.
    expect(Number.isSafeInteger(JSON.parse(new TextDecoder().decode(body))["m:t"].events.at(-1).event.data.stored.parent_hash)).toBe(false);
  });

  test("the result does not depend on where chunks split (every split of a sample body)", async () => {
    const idx = sampleIndex(2, 2, 3);
    const body = await readAll(dumpStream(idx));
    const expected = idx.snapshot();
    for (let size = 1; size <= 7; size++) expect(parse(body, size)).toEqual(expected);
    for (let cut = 1; cut < body.length; cut++) {
      const out: RouterEvent[] = [];
      const p = new DumpParser((_k, _b, e) => out.push(e));
      p.push(body.subarray(0, cut));
      p.push(body.subarray(cut));
      p.end();
      expect(out.length).toBe(expected[0]!.events.length);
    }
  });

  test("property: writer → parser is the identity for any index and any chunking", async () => {
    const u64 = fc.bigInt({ min: 0n, max: U64_MAX });
    const event = fc.record({
      workerId: fc.string({ unit: "grapheme", maxLength: 12 }),
      dpRank: fc.nat(64),
      eventId: fc.nat(),
      parentHash: fc.option(u64, { nil: null }),
      blocks: fc.array(fc.record({ blockHash: u64, tokensHash: u64 }), { maxLength: 5 }),
    });
    const model = fc.record({ key: fc.string({ unit: "grapheme", maxLength: 10 }), blockSize: fc.integer({ min: 1, max: 256 }), events: fc.array(event, { maxLength: 6 }) });
    const models = fc.uniqueArray(model, { selector: (m) => m.key, maxLength: 3 });
    await fc.assert(
      fc.asyncProperty(models, fc.integer({ min: 1, max: 64 }), async (ms, chunk) => {
        const body = await readAll(dumpStream(new MapIndex(ms), { chunkBytes: 16 }));
        const parsed = parse(body, chunk);
        // A model with no events yields nothing to apply: compare what has events.
        expect(parsed).toEqual(ms.filter((m) => m.events.length > 0));
      }),
      { numRuns: 200 },
    );
  });

  test("readDump yields events as bytes arrive, before the body ends", async () => {
    let push!: (b: Uint8Array) => void;
    const body = new ReadableStream<Uint8Array>({ start: (c) => void (push = (b) => c.enqueue(b)) });
    const it = readDump(body);
    push(enc.encode('{"m":{"block_size":16,"events":[{"worker_id":"a","event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[]}}},"dp_rank":0},'));
    const first = await it.next();
    expect(first.value).toMatchObject({ key: "m", blockSize: 16, event: { workerId: "a", eventId: 1 } });
    await it.return(undefined);
  });

  test("tolerates whitespace, escapes, unknown fields and events before block_size", () => {
    const body = ` { "m\\u003at" : { "extra": [1, {"x": -1.5e3}, "s", true], "events" : [ { "dp_rank": 2, "future": {"a": [null]},
      "event": { "data": { "stored": { "blocks": [ { "tokens_hash": 2, "block_hash": 18446744073709551615 } ], "parent_hash": 5 } }, "event_id": 3 },
      "worker_id": "w\\u00e9\\ud83d\\ude00" } ], "block_size": 32 } } `;
    expect(parse(body, 3)).toEqual([
      { key: "m:t", blockSize: 32, events: [{ workerId: "wé😀", dpRank: 2, eventId: 3, parentHash: 5n, blocks: [{ blockHash: U64_MAX, tokensHash: 2n }] }] },
    ]);
  });

  const bad: [string, string][] = [
    ["truncated body", '{"m":{"block_size":16,"events":[{"worker_id":"a"'],
    ["truncated number", '{"m":{"block_size":16'],
    ["empty body", ""],
    ["invalid JSON", '{"m":{"block_size":16,"events":[}}'],
    ["trailing garbage", "{} x"],
    ["not an object", "[]"],
    ["hash beyond u64", '{"m":{"block_size":16,"events":[{"worker_id":"a","event":{"event_id":1,"data":{"stored":{"parent_hash":18446744073709551616,"blocks":[]}}},"dp_rank":0}]}}'],
    ["block hash beyond u64", '{"m":{"block_size":16,"events":[{"worker_id":"a","event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":18446744073709551616,"tokens_hash":1}]}}},"dp_rank":0}]}}'],
    ["21-digit tokens hash", '{"m":{"block_size":16,"events":[{"worker_id":"a","event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":1,"tokens_hash":100000000000000000000}]}}},"dp_rank":0}]}}'],
    ["leading zero in a block hash", '{"m":{"block_size":16,"events":[{"worker_id":"a","event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":01,"tokens_hash":1}]}}},"dp_rank":0}]}}'],
    ["a block that is not closed", '{"m":{"block_size":16,"events":[{"worker_id":"a","event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":1,"tokens_hash":1]}}},"dp_rank":0}]}}'],
    ["negative hash", '{"m":{"block_size":16,"events":[{"worker_id":"a","event":{"event_id":1,"data":{"stored":{"parent_hash":-1,"blocks":[]}}},"dp_rank":0}]}}'],
    ["fractional hash", '{"m":{"block_size":16,"events":[{"worker_id":"a","event":{"event_id":1,"data":{"stored":{"parent_hash":1.5,"blocks":[]}}},"dp_rank":0}]}}'],
    ["leading zero", '{"m":{"block_size":016,"events":[]}}'],
    ["missing worker_id", '{"m":{"block_size":16,"events":[{"event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[]}}},"dp_rank":0}]}}'],
    ["block without tokens_hash", '{"m":{"block_size":16,"events":[{"worker_id":"a","event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":1}]}}},"dp_rank":0}]}}'],
    ["removed event kind", '{"m":{"block_size":16,"events":[{"worker_id":"a","event":{"event_id":1,"data":{"removed":{"block_hashes":[1]}}},"dp_rank":0}]}}'],
    ["missing block_size", '{"m":{"events":[]}}'],
    ["string as block_size", '{"m":{"block_size":"16","events":[]}}'],
    ["control char in string", '{"m\n":{"block_size":16,"events":[]}}'],
    ["bad literal", '{"m":{"block_size":16,"events":[{"worker_id":"a","event":{"event_id":1,"data":{"stored":{"parent_hash":nul,"blocks":[]}}},"dp_rank":0}]}}'],
    ["missing colon", '{"m" {"block_size":16}}'],
    ["trailing comma", '{"m":{"block_size":16,"events":[],}}'],
    ["a model key twice", '{"m":{"block_size":16,"events":[]},"m":{"block_size":32,"events":[]}}'],
    ["block_size twice", '{"m":{"block_size":16,"events":[],"block_size":32}}'],
  ];
  for (const [name, body] of bad) {
    test(`rejects a malformed dump: ${name}`, () => {
      for (const chunk of [1, 5, Infinity]) expect(() => parse(body, chunk)).toThrow(DumpFormatError);
    });
  }

  test("enforces the body size limit and the per-event block limit", async () => {
    const body = await readAll(dumpStream(sampleIndex(2, 2, 4)));
    expect(() => parse(body, 64, { maxBytes: body.length - 1 })).toThrow(/larger than the limit/);
    expect(() => parse(body, 64, { maxEventBlocks: 3 })).toThrow(/more than 3 blocks/);
    expect(parse(body, 64, { maxBytes: body.length, maxEventBlocks: 4 })[0]!.events.length).toBe(4);
  });

  test("events before block_size are bounded while one of them grows, not only once it ends", () => {
    // One event of 20 blocks before block_size, against a limit of 10 buffered blocks: refused at the
    // 12th block, whatever the mode (the typed mode copied the whole event into objects first).
    const blocks = Array.from({ length: 20 }, (_, i) => `{"block_hash":${i + 1},"tokens_hash":1}`).join(",");
    const body = `{"m":{"events":[{"worker_id":"a","dp_rank":0,"event":{"event_id":1,"data":{"stored":{"parent_hash":null,"blocks":[${blocks}]}}}}],"block_size":16}}`;
    for (const typed of [false, true]) {
      let seen = 0;
      const p = new DumpParser(() => seen++, { maxBufferedBlocks: 10 }, typed ? { sink: () => seen++, events: 3, blocks: 5 } : undefined);
      const bytes = new TextEncoder().encode(body);
      const cut = body.indexOf('"block_hash":14');
      expect(() => p.push(bytes.subarray(0, cut))).toThrow(/too many events before block_size/);
      expect(seen).toBe(0);
    }
  });
});
