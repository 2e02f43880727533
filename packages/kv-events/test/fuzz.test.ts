// Property-based fuzzing: random and truncated msgpack and ZMTP input never lets an exception
// escape; every failure is a counted, typed outcome.
import { afterAll, describe, expect, test } from "bun:test";
import fc from "fast-check";
import { decodeBatch, encodeBatch, EVENT_ENCODINGS, KvDecodeError, type KvEventBatch, newDecodeStats, PubSocket } from "../src/index.ts";
import { decodeGeneric } from "../src/codec/decode.ts";
import { decodeFast } from "../src/codec/fast-decode.ts";
import { ZmtpParser } from "../src/zmtp/parser.ts";
import { encodeCommand, encodeGreeting, encodeMessage, encodeReady } from "../src/zmtp/wire.ts";
import { RawPeer } from "./raw-peer.ts";
import { waitUntil } from "./zmq-peer.ts";
import { LOOPBACK } from "@kv-epp/testkit";

const sample: KvEventBatch = {
  ts: 12.25,
  events: [
    {
      type: "BlockStored", blockHashes: [1n, 2n ** 64n - 2n], parentBlockHash: 9n, tokenIds: [1, 2, 3, 4], blockSize: 2, loraId: 1, medium: "GPU",
      loraName: "x", extraKeys: [["x", ["e".repeat(64), 3], "salt"], [Uint8Array.of(1, 2, 3)]], groupIdx: 1, cacheSalt: "salt", sessionId: "s",
    },
    { type: "BlockRemoved", blockHashes: [3n], medium: "CPU", groupIdx: 0, ownership: "tier" },
    // SGLang's EAGLE bigram pages (written as pairs by the sglang encoders, plain by the others)
    { type: "BlockStored", blockHashes: [5n], parentBlockHash: null, tokenIds: [70000, 7], blockSize: 2, loraId: null, medium: null, bigramNextTokenId: 300 },
    { type: "AllBlocksCleared" },
  ],
  dataParallelRank: 3,
};
const valid = EVENT_ENCODINGS.flatMap((encoding) => [encodeBatch(sample, { encoding }), encodeBatch(sample, { encoding, hashMode: "bytes" })]);

/** Decodes, classifying the outcome: a batch, or a KvDecodeError. Anything else fails the property. */
function decodeOutcome(p: Uint8Array): "ok" | "error" {
  const stats = newDecodeStats();
  try {
    decodeBatch(p, stats);
    return "ok";
  } catch (e) {
    if (e instanceof KvDecodeError) return "error";
    throw e;
  }
}

/** The hand-written fast path must agree with the msgpackr path whenever it answers. */
function agree(p: Uint8Array): void {
  const fast = decodeFast(p);
  if (fast === undefined) return;
  expect(decodeGeneric(p)).toEqual(fast.batch);
}

/** Valid payloads with a few bytes overwritten. */
const mutated = fc
  .tuple(fc.constantFrom(...valid), fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { minLength: 1, maxLength: 6 }))
  .map(([v, muts]) => {
    const b = Uint8Array.from(v);
    for (const [i, x] of muts) b[i % b.length] = x;
    return b;
  });
const truncations = valid.flatMap((v) => Array.from({ length: v.length }, (_, n) => v.subarray(0, n)));

describe("msgpack fuzzing", () => {
  test("the fast decoder answers for every encoder output and agrees with the msgpackr decoder", () => {
    for (const v of valid) {
      expect(decodeFast(v)).toBeDefined();
      agree(v);
    }
  });

  test("random bytes: a batch or a KvDecodeError, never anything else; the fast path declines or agrees", () => {
    fc.assert(fc.property(fc.uint8Array({ maxLength: 200 }), (b) => void (decodeOutcome(b), agree(b))), { numRuns: 3000 });
  });

  test("every truncation of a valid payload: a batch or a KvDecodeError; the fast path declines or agrees", () => {
    for (const t of truncations) {
      decodeOutcome(t);
      agree(t);
    }
  });

  test("byte mutations of valid payloads: a batch or a KvDecodeError; the fast path declines or agrees", () => {
    fc.assert(fc.property(mutated, (b) => void (decodeOutcome(b), agree(b))), { numRuns: 5000 });
  });
});

type Seen = { greeting?: string; frames: string[]; error: string | null };

function parseAll(chunks: Uint8Array[]): Seen {
  const seen: Seen = { frames: [], error: null };
  const parser = new ZmtpParser(
    {
      greeting: (g) => void (seen.greeting = g.toString("hex")),
      frame: (f, b) => void seen.frames.push(`${f}:${b.toString("hex")}`),
    },
    4096,
  );
  for (const c of chunks) parser.push(Buffer.from(c));
  seen.error = parser.error;
  return seen;
}

/** Splits a stream at random points. */
const chunked = (stream: fc.Arbitrary<Uint8Array>) =>
  stream.chain((s) => fc.array(fc.nat({ max: s.length }), { maxLength: 8 }).map((cuts) => {
    const points = [...new Set([0, ...cuts, s.length])].sort((a, b) => a - b);
    return { whole: s, chunks: points.slice(1).map((p, i) => s.subarray(points[i]!, p)) };
  }));

const frameStream = fc
  .array(fc.tuple(fc.uint8Array({ maxLength: 600 }), fc.boolean()), { maxLength: 6 })
  .map((frames) => {
    const parts: Uint8Array[] = [encodeGreeting(1, false)];
    for (const [body, more] of frames) {
      const m = encodeMessage([body]);
      if (more) m[0]! |= 1;
      parts.push(m);
    }
    return Uint8Array.from(Buffer.concat(parts));
  });

describe("ZMTP fuzzing", () => {
  test("random bytes never throw out of the parser; the outcome is frames or a recorded error", () => {
    fc.assert(fc.property(fc.uint8Array({ maxLength: 300 }), fc.boolean(), (b, withGreeting) => {
      const input = withGreeting ? Buffer.concat([encodeGreeting(1, false), b]) : b;
      parseAll([input]);
    }), { numRuns: 3000 });
  });

  test("however a valid stream is split into TCP chunks, the parser sees the same frames", () => {
    fc.assert(fc.property(chunked(frameStream), ({ whole, chunks }) => {
      expect(parseAll(chunks)).toEqual(parseAll([whole]));
      expect(parseAll([whole]).error).toBeNull();
    }), { numRuns: 500 });
  });

  test("truncated and split garbage after a greeting matches the unsplit outcome", () => {
    fc.assert(fc.property(chunked(fc.uint8Array({ maxLength: 400 }).map((b) => Uint8Array.from(Buffer.concat([encodeGreeting(1, false), b])))), ({ whole, chunks }) => {
      expect(parseAll(chunks)).toEqual(parseAll([whole]));
    }), { numRuns: 1000 });
  });

  describe("over TCP", () => {
    const pubP = (async () => {
      const pub = new PubSocket({ maxMessageSize: 4096, handshakeTimeoutMs: 300 });
      return { pub, endpoint: await pub.bind(`tcp://${LOOPBACK}.1.5:0`) };
    })();
    afterAll(async () => (await pubP).pub.close());

    test("random bytes from many peers close only those connections; the publisher keeps serving", async () => {
      const { pub, endpoint } = await pubP;
      await fc.assert(
        fc.asyncProperty(fc.uint8Array({ minLength: 1, maxLength: 200 }), fc.boolean(), async (junk, handshake) => {
          const raw = await RawPeer.open(endpoint);
          if (handshake) raw.write(Buffer.concat([encodeGreeting(1, false), encodeReady("SUB")]));
          raw.write(junk);
          await new Promise((r) => setTimeout(r, 5));
          raw.close();
        }),
        { numRuns: 40 },
      );
      const good = await RawPeer.handshake(endpoint, 1, "SUB");
      good.write(encodeCommand("SUBSCRIBE", Buffer.alloc(0)));
      await waitUntil(() => pub.send([Buffer.from("alive")]) >= 1);
      await waitUntil(() => good.dataFrames().some((f) => f.toString() === "alive"));
      good.close();
      expect(pub.counters.accepted).toBeGreaterThanOrEqual(41);
    });
  });
});
