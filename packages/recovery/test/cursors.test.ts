// Stream cursors and copy counts in /dump: written after each model's events, read back exactly in both
// parser modes, and invisible to a parser that predates them (it still reads every event).
import type { RouterEvent, StreamCursor } from "@kv-epp/protocol";
import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { type DumpBatch, DumpParser, dumpStream } from "../src/index.ts";
import { BEFORE_EPOCHS, fromHistory, readAll } from "./helpers.ts";

const U64_MAX = 0xffff_ffff_ffff_ffffn;

const events: RouterEvent[] = [
  { workerId: "w-1", dpRank: 0, eventId: 0, parentHash: null, blocks: [{ blockHash: U64_MAX, tokensHash: 5n, copies: 3 }, { blockHash: 7n, tokensHash: 8n }, { blockHash: 11n, tokensHash: 12n, copies: 0 }] },
  { workerId: "w-2", dpRank: 1, eventId: 1, parentHash: 1n << 63n, blocks: [{ blockHash: 9n, tokensHash: 10n, copies: 4_294_967_295 }] },
];
const cursors: StreamCursor[] = [
  { workerId: "w-1", dpRank: 0, seq: U64_MAX - 1n, baseline: 0n, complete: true, epoch: null },
  { workerId: "w-2", dpRank: 1, seq: null, baseline: null, complete: false, epoch: null },
  { workerId: "w-\"3\"", dpRank: 2, seq: 12n, baseline: 4n, complete: false, epoch: null },
];
const source = (withCursors: boolean) => ({
  models: () => [
    { key: "m:t", blockSize: 16, events, ...(withCursors ? { cursors: () => cursors } : {}) },
    { key: "other:t", blockSize: 32, events: [] as RouterEvent[] },
  ],
});

type Parsed = { events: [string, RouterEvent][]; cursors: [string, StreamCursor[]][] };
function parse(body: Uint8Array, typed: boolean, chunk = Infinity): Parsed {
  const out: Parsed = { events: [], cursors: [] };
  const p = new DumpParser(
    (key, _bs, e) => out.events.push([key, e]),
    {},
    typed ? { sink: (key: string, _bs: number, b: DumpBatch) => { for (let i = 0; i < b.count; i++) out.events.push([key, b.event(i)]); }, events: 1, blocks: 2 } : undefined,
    (key, cs) => out.cursors.push([key, cs]),
  );
  for (let i = 0; i < body.length; i += Math.min(chunk, body.length)) p.push(body.subarray(i, i + chunk));
  p.end();
  return out;
}

describe("/dump cursors and copies", () => {
  test("are written after the model's events, copies only where not 1", async () => {
    const text = new TextDecoder().decode(await readAll(dumpStream(source(true))));
    expect(text).toContain('{"block_hash":18446744073709551615,"tokens_hash":5,"copies":3},{"block_hash":7,"tokens_hash":8},{"block_hash":11,"tokens_hash":12,"copies":0}]');
    expect(text).toContain(
      '"dp_rank":1}],"cursors":[{"worker_id":"w-1","dp_rank":0,"seq":18446744073709551614,"baseline":0,"complete":true},' +
        '{"worker_id":"w-2","dp_rank":1,"seq":null,"baseline":null,"complete":false},{"worker_id":"w-\\"3\\"","dp_rank":2,"seq":12,"baseline":4,"complete":false}]}',
    );
    // a model without cursors has no "cursors" key (not an empty list: that would claim every rank unknown)
    expect(text).toEndWith('"other:t":{"block_size":32,"events":[]}}');
  });

  for (const typed of [false, true])
    test(`round-trip exactly through the parser (${typed ? "typed batches" : "objects"}), however the body is split`, async () => {
      const body = await readAll(dumpStream(source(true)));
      for (const chunk of [Infinity, 1, 7, 64]) {
        const got = parse(body, typed, chunk);
        expect(got.events).toEqual(events.map((e) => ["m:t", e] as [string, RouterEvent]));
        expect(got.cursors).toEqual([["m:t", cursors]]);
      }
    });

  test("cursors in any key order and with unknown fields are read; a cursor without `complete` is malformed", () => {
    const body = '{"m":{"cursors":[{"complete":true,"x":[1,{"seq":3}],"seq":5,"dp_rank":0,"worker_id":"w"}],"block_size":4,"events":[]}}';
    expect(parse(new TextEncoder().encode(body), false).cursors).toEqual([["m", [{ workerId: "w", dpRank: 0, seq: 5n, baseline: null, complete: true, epoch: null }]]]);
    expect(() => parse(new TextEncoder().encode('{"m":{"block_size":4,"cursors":[{"worker_id":"w","dp_rank":0}]}}'), false)).toThrow(/cursor needs/);
    expect(() => parse(new TextEncoder().encode('{"m":{"block_size":4,"events":[{"worker_id":"w","dp_rank":0,"event":{"event_id":0,"data":{"stored":{"parent_hash":null,"blocks":[{"block_hash":1,"tokens_hash":2,"copies":4294967296}]}}}}]}}'), false)).toThrow(/copies/);
  });

  test("an epoch is written only where a cursor has one and read back exactly (any UTF-8, a BOM kept); an empty or overlong one reads as none, a non-string one is malformed", async () => {
    const longest = "\uFEFF" + 'é"' + "e".repeat(250); // 256 bytes of UTF-8
    const withEpochs: StreamCursor[] = [{ ...cursors[0]!, epoch: "ab".repeat(16) }, cursors[1]!, { ...cursors[2]!, epoch: longest }];
    const body = await readAll(dumpStream({ models: () => [{ key: "m:t", blockSize: 16, events, cursors: () => withEpochs }] }));
    expect(new TextDecoder().decode(body)).toContain(`"complete":true,"epoch":"${"ab".repeat(16)}"},{"worker_id":"w-2","dp_rank":1,"seq":null,"baseline":null,"complete":false},`);
    for (const typed of [false, true]) for (const chunk of [Infinity, 1, 7]) expect(parse(body, typed, chunk).cursors).toEqual([["m:t", withEpochs]]);
    const cursor = (epoch: string) => new TextEncoder().encode(`{"m":{"block_size":4,"cursors":[{"worker_id":"w","dp_rank":0,"complete":true,"epoch":${epoch}}]}}`);
    expect(parse(cursor("null"), false).cursors).toEqual([["m", [{ workerId: "w", dpRank: 0, seq: null, baseline: null, complete: true, epoch: null }]]]);
    for (const unread of ['""', `"${"e".repeat(257)}"`]) expect(parse(cursor(unread), false).cursors).toEqual(parse(cursor("null"), false).cursors);
    expect(() => parse(cursor("5"), false)).toThrow(/unexpected number/);
  });

  test("a parser from before epochs reads the cursors of a dump that has them, without their epochs", async () => {
    const dir = fromHistory(BEFORE_EPOCHS, ["src/dump/parser.ts", "src/dump/batch.ts", "src/dump/json-tokenizer.ts"]);
    const old = (await import(join(dir, "src/dump/parser.ts"))) as { DumpParser: typeof DumpParser };
    const withEpochs = cursors.map((c, i) => ({ ...c, epoch: i === 1 ? null : `epoch-${i}` }));
    const got: [string, StreamCursor[]][] = [];
    const p = new old.DumpParser(() => {}, {}, undefined, (key, cs) => got.push([key, cs]));
    p.push(await readAll(dumpStream({ models: () => [{ key: "m:t", blockSize: 16, events, cursors: () => withEpochs }] })));
    p.end();
    expect(got).toEqual([["m:t", cursors.map(({ epoch: _, ...c }) => c as StreamCursor)]]);
  });

  test("a parser from before cursors and copies still reads every event of such a dump", async () => {
    // The parser as it was released before these fields existed, taken from this repository's history.
    const commit = "0eced0f6d1d1868431b9108f4676ff16e5004e00";
    const dir = fromHistory(commit, ["src/types.ts", "src/dump/parser.ts", "src/dump/batch.ts", "src/dump/json-tokenizer.ts"]);
    const old = (await import(join(dir, "src/dump/parser.ts"))) as { DumpParser: new (sink: (k: string, bs: number, e: RouterEvent) => void) => { push(b: Uint8Array): void; end(): void } };
    const body = await readAll(dumpStream(source(true)));
    const got: [string, RouterEvent][] = [];
    const p = new old.DumpParser((key, _bs, e) => got.push([key, e]));
    p.push(body);
    p.end();
    // Same events; the copy counts are what it does not know (it reads them as 1).
    expect(got).toEqual(events.map((e) => ["m:t", { ...e, blocks: e.blocks.map(({ blockHash, tokensHash }) => ({ blockHash, tokensHash })) }] as [string, RouterEvent]));
  });
});
