// The binary /dump body: negotiated by Accept (JSON stays the default), round-trips events, copies, cursors
// and adapters exactly however it is split, refuses malformed bodies without holding more than they sent,
// and interoperates both ways with a release that only speaks JSON (its code taken from history).
import { afterEach, describe, expect, test } from "bun:test";
import { DUMP_BINARY_CONTENT_TYPE, DUMP_BINARY_MAGIC, DUMP_CURSOR_FLAGS, DUMP_FRAME, type RouterEvent, type StreamCursor } from "@kv-epp/protocol";
import { join } from "node:path";
import { BinaryDumpParser, type BinaryDumpSinks, type DumpSource, dumpBinaryChunks, dumpHandler, dumpStream, fetchDump, stageEvents, wantsBinary, DumpParser } from "../src/index.ts";
import { BEFORE_EPOCHS, fromHistory, MapIndex, quietLogger, readAll, startPeer } from "./helpers.ts";

const U64_MAX = 0xffff_ffff_ffff_ffffn;
/** The last release before the binary body: its dump code only speaks JSON. */
const JSON_ONLY_RELEASE = "f357140483fd15a3253d21b810af86710ab2c63c";

const events: RouterEvent[] = [
  { workerId: "w-1", dpRank: 0, eventId: 0, parentHash: null, blocks: [{ blockHash: U64_MAX, tokensHash: 5n, copies: 3 }, { blockHash: 7n, tokensHash: 8n }, { blockHash: 11n, tokensHash: 12n, copies: 0 }] },
  { workerId: "w-1", dpRank: 0, eventId: 1, parentHash: 7n, blocks: [{ blockHash: 1n << 63n, tokensHash: U64_MAX }] },
  { workerId: "w-2", dpRank: 1, eventId: 2, parentHash: 1n << 63n, blocks: [{ blockHash: 9n, tokensHash: 10n, copies: 4_294_967_295 }] },
];
const cursors: StreamCursor[] = [
  { workerId: "w-1", dpRank: 0, seq: U64_MAX - 1n, baseline: 0n, complete: true, epoch: "\uFEFFé-epoch" },
  { workerId: "w-2", dpRank: 1, seq: null, baseline: null, complete: false, epoch: null },
];
const adapters = ["lora-a", "é\"b"];
const source: DumpSource = {
  models: () => [
    { key: "m:t", blockSize: 16, events, cursors: () => cursors, adapters: () => adapters, sizes: () => ({ blocks: 5, residencies: 5 }) },
    { key: "other:t", blockSize: 32, events: [] as RouterEvent[] },
  ],
};

type Parsed = { events: [string, RouterEvent][]; cursors: [string, StreamCursor[]][]; adapters: [string, string[]][]; sizes: [string, number, number][]; runs: number };
function sinks(out: Parsed, bulk = false): BinaryDumpSinks {
  return {
    event: (key, _bs, e) => out.events.push([key, e]),
    cursors: (key, cs) => out.cursors.push([key, cs]),
    adapters: (key, names) => out.adapters.push([key, names]),
    sizes: (key, _bs, s) => out.sizes.push([key, s.blocks, s.residencies]),
    ...(bulk ? { events: () => void out.runs++ } : {}),
  };
}
const empty = (): Parsed => ({ events: [], cursors: [], adapters: [], sizes: [], runs: 0 });
function parse(body: Uint8Array, chunk = Infinity, bulk = false, limits = {}): Parsed {
  const out = empty();
  const p = new BinaryDumpParser(sinks(out, bulk), limits);
  for (let i = 0; i < body.length; i += Math.min(chunk, body.length)) p.push(body.subarray(i, i + chunk));
  p.end();
  return out;
}
const body = async (s: DumpSource, chunkBytes?: number) => Buffer.concat([...dumpBinaryChunks(s, chunkBytes)]);

/** A body from frames built by hand: [type, payload bytes]. */
function frames(...fs: [number, number[] | Uint8Array][]): Uint8Array {
  const parts: Uint8Array[] = [new TextEncoder().encode(DUMP_BINARY_MAGIC)];
  for (const [type, payload] of fs) {
    const h = new DataView(new ArrayBuffer(8));
    h.setUint32(0, type, true);
    h.setUint32(4, payload.length, true);
    parts.push(new Uint8Array(h.buffer), Uint8Array.from(payload));
  }
  return Buffer.concat(parts);
}
const u32 = (...xs: number[]) => [...new Uint8Array(Uint32Array.from(xs).buffer)];
const u64 = (...xs: bigint[]) => [...new Uint8Array(BigUint64Array.from(xs).buffer)];
const utf8 = (s: string) => [...new TextEncoder().encode(s)];
const model = (key = "m", blockSize = 4) => [DUMP_FRAME.model, [...u32(blockSize, 0, 0), ...utf8(key)]] as [number, number[]];
const worker = (id = "w", rank = 0) => [DUMP_FRAME.worker, [...u32(rank), ...utf8(id)]] as [number, number[]];
const end: [number, number[]] = [DUMP_FRAME.end, []];
/** A CURSORS frame of one cursor (worker "w", rank 0, seq 1). */
const oneCursor = [DUMP_FRAME.cursors, [...u32(DUMP_CURSOR_FLAGS.seq, 0), ...u64(1n, 0n), ...u32(1), ...utf8("w")]] as [number, number[]];
const epochsFrame = (...entries: number[][]) => [DUMP_FRAME.cursorEpochs, entries.flat()] as [number, number[]];

describe("binary /dump body", () => {
  test("round-trips events (copies included), cursors, adapters and announced sizes exactly, however it is split", async () => {
    const b = await body(source);
    for (const chunk of [Infinity, 1, 7, 64]) {
      const got = parse(b, chunk);
      // event ids are the body's order, as a JSON producer numbers them
      expect(got.events).toEqual(events.map((e) => ["m:t", e] as [string, RouterEvent]));
      expect(got.cursors).toEqual([["m:t", cursors]]);
      expect(got.adapters).toEqual([["m:t", adapters]]);
      expect(got.sizes).toEqual([["m:t", 5, 5]]);
    }
    // the bulk path gets one run per worker rank's frame instead of objects
    const bulk = parse(b, Infinity, true);
    expect([bulk.events.length, bulk.runs]).toEqual([0, 2]);
    // about a quarter of the JSON's bytes
    expect(b.length * 2).toBeLessThan((await readAll(dumpStream(source))).length);
  });

  test("the same events come out of the JSON and the binary body; adapters travel in both", async () => {
    const json = { events: [] as [string, RouterEvent][], adapters: [] as [string, string[]][] };
    const p = new DumpParser((key, _bs, e) => json.events.push([key, e]), {}, undefined, undefined, { adapters: (key, names) => json.adapters.push([key, names]) });
    p.push(await readAll(dumpStream(source)));
    p.end();
    const bin = parse(await body(source));
    expect(bin.events).toEqual(json.events);
    expect(json.adapters).toEqual([["m:t", adapters]]);
  });

  test("a JSON parser from before adapters reads every event of a dump that has them", async () => {
    const dir = fromHistory(JSON_ONLY_RELEASE, ["src/types.ts", "src/dump/parser.ts", "src/dump/batch.ts", "src/dump/json-tokenizer.ts"]);
    const old = (await import(join(dir, "src/dump/parser.ts"))) as { DumpParser: new (sink: (k: string, bs: number, e: RouterEvent) => void) => { push(b: Uint8Array): void; end(): void } };
    const got: [string, RouterEvent][] = [];
    const p = new old.DumpParser((key, _bs, e) => got.push([key, e]));
    p.push(await readAll(dumpStream(source)));
    p.end();
    expect(got).toEqual(events.map((e) => ["m:t", e] as [string, RouterEvent]));
  });

  test("cursor epochs: a longest one (256 bytes) round-trips, and a dump whose cursors have none keeps the bytes of a writer from before epochs", async () => {
    const longest = "\uFEFF" + "é" + "e".repeat(251);
    const withLongest: StreamCursor[] = [{ ...cursors[0]!, epoch: longest }, cursors[1]!];
    expect(parse(await body({ models: () => [{ key: "m:t", blockSize: 16, events, cursors: () => withLongest }] }), 3).cursors).toEqual([["m:t", withLongest]]);
    const none: DumpSource = { models: () => [{ key: "m:t", blockSize: 16, events, cursors: () => cursors.map((c) => ({ ...c, epoch: null })) }] };
    const dir = fromHistory(BEFORE_EPOCHS, ["src/dump/binary-writer.ts", "src/dump/chunk-buffer.ts", "src/dump/event-run.ts", "src/dump/batch.ts"]);
    const old = (await import(join(dir, "src/dump/binary-writer.ts"))) as { dumpBinaryChunks: typeof dumpBinaryChunks };
    expect(await body(none)).toEqual(Buffer.concat([...old.dumpBinaryChunks(none)]));
    expect(parse(await body(none)).cursors).toEqual([["m:t", cursors.map((c) => ({ ...c, epoch: null }))]]);
  });

  test("a binary parser from before cursor epochs reads a body that has them: every event and cursor, the epochs' frame skipped as unknown", async () => {
    const dir = fromHistory(BEFORE_EPOCHS, ["src/dump/binary-parser.ts", "src/dump/event-run.ts", "src/dump/parser.ts", "src/dump/batch.ts", "src/dump/json-tokenizer.ts"]);
    const old = (await import(join(dir, "src/dump/binary-parser.ts"))) as { BinaryDumpParser: typeof BinaryDumpParser };
    const out = empty();
    const p = new old.BinaryDumpParser(sinks(out));
    p.push(await body(source));
    p.end();
    expect(out.events).toEqual(events.map((e) => ["m:t", e] as [string, RouterEvent]));
    expect(out.cursors).toEqual([["m:t", cursors.map(({ epoch: _, ...c }) => c as StreamCursor)]]);
  });

  test("unknown frame types are skipped (a newer producer's); an unaccepted model is skipped unread", () => {
    const ev = [DUMP_FRAME.events, [...u64(1n << 32n), ...u64(1n, 2n)]] as [number, number[]];
    const got = parse(frames([99, [1, 2, 3]], model(), [42, []], worker(), ev, end));
    expect(got.events).toEqual([["m", { workerId: "w", dpRank: 0, eventId: 0, parentHash: null, blocks: [{ blockHash: 1n, tokensHash: 2n }] }]]);
    const out = empty();
    const p = new BinaryDumpParser({ ...sinks(out), acceptModel: (k) => k !== "x" });
    p.push(frames(model("x"), worker(), [DUMP_FRAME.events, [1, 2, 3]], [DUMP_FRAME.cursors, [9]], model("m"), worker(), ev, end));
    p.end();
    expect([p.skippedModels, out.events.length]).toEqual([1, 1]);
  });

  const malformed: [string, Uint8Array, RegExp][] = [
    ["a JSON body", new TextEncoder().encode('{"m":{"block_size":4,"events":[]}}'), /bad magic/],
    ["no end frame", frames(model()), /truncated/],
    ["a cut frame", frames(model()).subarray(0, 20), /truncated/],
    ["bytes after the end", Buffer.concat([frames(end), new Uint8Array([0])]), /after the end/],
    ["events before a worker", frames(model(), [DUMP_FRAME.events, u64(0n)], end), /before a worker/],
    ["a worker before any model", frames(worker(), end), /before any model/],
    ["unknown event flags", frames(model(), worker(), [DUMP_FRAME.events, u64(4n)], end), /flags/],
    ["a count past the frame", frames(model(), worker(), [DUMP_FRAME.events, u64(3n << 32n, 1n)], end), /past its frame/],
    ["a partial word", frames(model(), worker(), [DUMP_FRAME.events, [1, 0, 0]], end), /whole number/],
    ["copies of 2^32", frames(model(), worker(), [DUMP_FRAME.events, u64((1n << 32n) | 2n, 1n, 2n, 1n << 32n)], end), /copies/],
    ["a model twice", frames(model(), model(), end), /twice/],
    ["block_size 0", frames(model("m", 0), end), /block_size/],
    ["a model frame too short", frames([DUMP_FRAME.model, u32(4)], end), /needs block_size/],
    ["two cursor frames", frames(model(), [DUMP_FRAME.cursors, []], [DUMP_FRAME.cursors, []], end), /two cursor/],
    ["a cursor past its frame", frames(model(), [DUMP_FRAME.cursors, [...u32(1, 0), ...u64(1n, 0n), ...u32(50)]], end), /past its frame/],
    ["a cursor epoch past its frame", frames(model(), epochsFrame(u32(5), utf8("e")), oneCursor, end), /cursor epoch runs past/],
    ["more cursor epochs than cursors", frames(model(), epochsFrame(u32(0), u32(0)), oneCursor, end), /2 cursor epochs for 1 cursors/],
    ["cursor epochs after the cursors", frames(model(), oneCursor, epochsFrame(u32(0)), end), /epochs after the model's cursor frame/],
    ["cursor epochs without cursors", frames(model(), epochsFrame(u32(0)), model("n"), end), /epochs without a cursor frame/],
    ["an adapter past its frame", frames(model(), [DUMP_FRAME.adapters, u32(9)], end), /past its frame/],
    ["invalid UTF-8", frames([DUMP_FRAME.model, [...u32(4, 0, 0), 0xff]], end), /UTF-8/],
    ["an end frame with a payload", frames([DUMP_FRAME.end, [0]]), /payload/],
  ];
  test("a cursor epoch this release cannot read (over 256 bytes, not UTF-8) is none: the rest of the dump stands", () => {
    for (const epoch of [utf8("e".repeat(257)), [0xff, 0xfe]]) {
      const b = frames(model(), epochsFrame(u32(epoch.length), epoch), oneCursor, end);
      for (const chunk of [Infinity, 1]) expect(parse(b, chunk).cursors).toEqual([["m", [{ workerId: "w", dpRank: 0, seq: 1n, baseline: null, complete: false, epoch: null }]]]);
    }
  });

  for (const [what, b, why] of malformed)
    test(`refuses ${what}, whole or byte by byte`, () => {
      expect(() => parse(b)).toThrow(why);
      expect(() => parse(b, 1)).toThrow(why);
    });

  test("a frame claiming more than the limit fails at its header, before anything is held", () => {
    const head = new Uint8Array(16);
    head.set(new TextEncoder().encode(DUMP_BINARY_MAGIC));
    new DataView(head.buffer).setUint32(8, DUMP_FRAME.events, true);
    new DataView(head.buffer).setUint32(12, 0xffff_ffff, true);
    expect(() => parse(head)).toThrow(/a frame of 4294967295 bytes/);
    // under the limit, a claimed frame grows its buffer only with the bytes that came
    const p = new BinaryDumpParser(sinks(empty()));
    new DataView(head.buffer).setUint32(8, DUMP_FRAME.model, true);
    new DataView(head.buffer).setUint32(12, 30 * 1024 * 1024, true);
    p.push(head);
    p.push(new Uint8Array(1000));
    expect((p as unknown as { frame: Uint8Array }).frame.length).toBeLessThanOrEqual(64 * 1024);
    expect(() => p.end()).toThrow(/truncated/);
  });

  test("a body past maxBytes fails as too large", () => {
    expect(() => parse(frames(model(), [77, new Uint8Array(5000)], end), 512, false, { maxBytes: 4096 })).toThrow(/larger than the limit/);
  });
});

describe("/dump content negotiation", () => {
  const servers: { stop(): void }[] = [];
  afterEach(() => {
    for (const s of servers.splice(0)) s.stop();
  });

  test("binary only when Accept names it with q > 0; JSON for everyone else", () => {
    expect(wantsBinary(null)).toBe(false);
    expect(wantsBinary("*/*")).toBe(false);
    expect(wantsBinary("application/json")).toBe(false);
    expect(wantsBinary(`${DUMP_BINARY_CONTENT_TYPE}, application/json;q=0.5`)).toBe(true);
    expect(wantsBinary(`application/json, ${DUMP_BINARY_CONTENT_TYPE.toUpperCase()};q=0.9`)).toBe(true);
    expect(wantsBinary(`${DUMP_BINARY_CONTENT_TYPE};q=0`)).toBe(false);
  });

  test("the handler answers each request in the format it asked for (HEAD too); binary can be switched off", async () => {
    const src = new MapIndex([{ key: "m:t", blockSize: 16, events }]);
    const p = startPeer(dumpHandler({ source: src, ready: () => true, logger: quietLogger() }));
    servers.push(p);
    const bin = await fetch(`${p.peer.url}/dump`, { headers: { accept: DUMP_BINARY_CONTENT_TYPE } });
    expect(bin.headers.get("content-type")).toBe(DUMP_BINARY_CONTENT_TYPE);
    expect(bin.headers.get("vary")).toBe("accept");
    expect(parse(new Uint8Array(await bin.arrayBuffer())).events.length).toBe(3);
    const json = await fetch(`${p.peer.url}/dump`);
    expect(json.headers.get("content-type")).toBe("application/json");
    expect(Object.keys((await json.json()) as object)).toEqual(["m:t"]);
    const head = await fetch(`${p.peer.url}/dump`, { method: "HEAD", headers: { accept: DUMP_BINARY_CONTENT_TYPE } });
    expect([head.status, head.headers.get("content-type")]).toEqual([200, DUMP_BINARY_CONTENT_TYPE]);
    const off = startPeer(dumpHandler({ source: src, ready: () => true, logger: quietLogger(), binary: false }));
    servers.push(off);
    expect((await fetch(`${off.peer.url}/dump`, { headers: { accept: DUMP_BINARY_CONTENT_TYPE } })).headers.get("content-type")).toBe("application/json");
  });

  test("fetchDump asks for binary and recovers the same events as over JSON", async () => {
    const src = new MapIndex([{ key: "m:t", blockSize: 16, events }]);
    const p = startPeer(dumpHandler({ source: src, ready: () => true, logger: quietLogger() }));
    servers.push(p);
    const viaBinary = new MapIndex(), viaJson = new MapIndex();
    expect(await fetchDump({ peer: p.peer, target: viaBinary, timeoutMs: 2000 })).toMatchObject({ format: "binary", events: 3 });
    expect(await fetchDump({ peer: p.peer, target: viaJson, timeoutMs: 2000, format: "json" })).toMatchObject({ format: "json", events: 3 });
    expect(viaBinary.snapshot()).toEqual(src.snapshot());
    expect(viaJson.snapshot()).toEqual(src.snapshot());
  });

  test("a malformed binary body from a peer fails the attempt as malformed, the staging aborted", async () => {
    const p = startPeer(() => new Response(frames(model(), worker(), [DUMP_FRAME.events, u64(3n << 32n)], end), { headers: { "content-type": DUMP_BINARY_CONTENT_TYPE } }));
    servers.push(p);
    const target = new MapIndex();
    await expect(fetchDump({ peer: p.peer, target, timeoutMs: 2000 })).rejects.toMatchObject({ reason: "malformed" });
    expect([target.commits, target.aborts]).toEqual([0, 1]);
  });

  /** A peer streaming `head` once, then `frame` forever (a fresh chunk of them per pull). */
  function endless(head: Uint8Array, frame: Uint8Array) {
    const chunk = Buffer.concat(Array.from({ length: Math.ceil(65536 / frame.length) }, () => frame));
    let sent = 0;
    const p = startPeer(() => {
      let first = true;
      return new Response(new ReadableStream({
        pull(c) {
          c.enqueue(first ? head : chunk);
          sent += first ? head.length : chunk.length;
          first = false;
        },
      }), { headers: { "content-type": DUMP_BINARY_CONTENT_TYPE } });
    });
    servers.push(p);
    return { peer: p.peer, sent: () => sent };
  }
  const framed = (type: number, payload: number[]) => frames([type, payload]).subarray(8); // without the magic

  test("an endless valid binary dump fails at the staging budget through the bulk path, the staging aborted", async () => {
    const p = endless(frames(model("m"), worker()), framed(DUMP_FRAME.events, [...u64(2n << 32n), ...u64(1n, 2n, 3n, 4n)]));
    let staged = 0, commits = 0, aborts = 0;
    const target = { begin: () => ({
      accepts: () => true, model() {}, extras() {}, commit: () => void commits++, abort: () => void aborts++,
      events: (_k: string, _w: unknown, run: Uint8Array) => void (staged += run.length),
      stagedBytes: () => staged,
    }) };
    const err = await fetchDump({ peer: p.peer, target, timeoutMs: 5000, budgetBytes: 1 << 20 }).catch((e) => e);
    expect(err).toMatchObject({ name: "DumpFetchError", reason: "budget" });
    expect(staged).toBeGreaterThan(1 << 20);
    expect(staged).toBeLessThan(4 << 20); // checked per chunk
    expect([commits, aborts]).toEqual([0, 1]);
  });

  test("an endless stream of unknown frames, or of an unserved model's events, stages nothing and ends at the byte limit", async () => {
    for (const [head, frame] of [
      [frames(), framed(77, [1, 2, 3, 4, 5])],
      [frames(model("other")), framed(DUMP_FRAME.events, [...u64(1n << 32n), ...u64(1n, 2n)])],
    ] as const) {
      const p = endless(head, frame);
      const index = new MapIndex();
      const target = { begin: () => ({ ...index.begin(), accepts: (k: string) => k === "m" }) };
      const err = await fetchDump({ peer: p.peer, target, timeoutMs: 5000, limits: { maxBytes: 4 << 20 }, budgetBytes: 1 << 20 }).catch((e) => e);
      expect(err).toMatchObject({ reason: "budget" });
      expect(err.message).toContain("larger than the limit");
      expect([index.eventCount, index.commits, index.aborts]).toEqual([0, 0, 1]);
    }
  });

  test("interop with a release that only speaks JSON, both directions", async () => {
    const dir = fromHistory(JSON_ONLY_RELEASE, [
      "src/types.ts", "src/dump/batch.ts", "src/dump/gc-pacer.ts", "src/dump/writer.ts", "src/dump/handler.ts",
      "src/dump/parser.ts", "src/dump/json-tokenizer.ts", "src/dump/client.ts",
    ]);
    const src = new MapIndex([{ key: "m:t", blockSize: 16, events }]);
    // a new client against the old server: asks for binary, gets JSON, recovers everything
    const oldHandler = (await import(join(dir, "src/dump/handler.ts"))).dumpHandler as typeof dumpHandler;
    const oldPeer = startPeer(oldHandler({ source: src, ready: () => true, logger: quietLogger() }));
    servers.push(oldPeer);
    const fromOld = new MapIndex();
    expect(await fetchDump({ peer: oldPeer.peer, target: fromOld, timeoutMs: 2000 })).toMatchObject({ format: "json", events: 3 });
    expect(fromOld.snapshot()).toEqual(src.snapshot());
    // the old client against a new server: it asks for JSON, and reads all of it
    const newPeer = startPeer(dumpHandler({ source: src, ready: () => true, logger: quietLogger() }));
    servers.push(newPeer);
    const oldFetch = (await import(join(dir, "src/dump/client.ts"))).fetchDump as typeof fetchDump;
    const fromNew = new MapIndex();
    // that release's staging took one event object at a time
    const oldTarget = { begin: () => {
      const s = fromNew.begin();
      return { apply: (key: string, blockSize: number, e: RouterEvent) => stageEvents(s, key, blockSize, [e]), commit: () => s.commit(), abort: () => s.abort() };
    } } as unknown as Parameters<typeof fetchDump>[0]["target"];
    expect(await oldFetch({ peer: newPeer.peer, target: oldTarget, timeoutMs: 2000 })).toMatchObject({ events: 3 });
    expect(fromNew.snapshot()).toEqual(src.snapshot());
  });
});
