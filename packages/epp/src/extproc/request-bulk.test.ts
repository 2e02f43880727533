import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import type { ProcessingRequest } from "./messages.ts";
import { loadProtos } from "./protos.ts";
import { besideBodyOverSoFar, bytesBesideBody } from "./request-bulk.ts";

const method = loadProtos().extProc.service.Process!;
const encode = (m: ProcessingRequest) => Buffer.from(method.requestSerialize(m));
const decode = method.requestDeserialize as (b: Buffer) => ProcessingRequest;
const enc = new TextEncoder();

function varint(v: number): number[] {
  const out: number[] = [];
  for (; v >= 128; v = Math.floor(v / 128)) out.push((v & 127) | 128);
  out.push(v);
  return out;
}
const len = (field: number, bytes: Uint8Array) => Buffer.concat([Buffer.from([(field << 3) | 2, ...varint(bytes.length)]), bytes]);
/** `n` empty HeaderValues in a request_headers: the cheapest objects per byte. */
const tinyHeaders = (n: number) => len(2, len(1, Buffer.from(new Uint8Array(2 * n).map((_, i) => (i % 2 ? 0 : 0x0a))))); // HttpHeaders.headers = HeaderMap

describe("bytesBesideBody", () => {
  test("is every byte but the body's, for any message the proto-loader serializer writes", () => {
    const header = fc.record({ key: fc.string({ maxLength: 20 }), raw_value: fc.uint8Array({ maxLength: 20 }) });
    const headers = fc.record({ headers: fc.record({ headers: fc.array(header, { maxLength: 5 }) }), end_of_stream: fc.boolean() });
    const body = fc.record({ body: fc.uint8Array({ maxLength: 3000 }), end_of_stream: fc.boolean() });
    const request = fc.oneof(
      fc.record({ request_headers: headers }),
      fc.record({ response_headers: headers }),
      fc.record({ request_body: body }),
      fc.record({ response_body: body }),
      fc.record({ request_trailers: fc.record({ trailers: fc.record({ headers: fc.array(header, { maxLength: 3 }) }) }) }),
    );
    const extra = fc.record(
      {
        observability_mode: fc.boolean(),
        protocol_config: fc.record({ request_body_mode: fc.constantFrom("NONE", "BUFFERED", "FULL_DUPLEX_STREAMED") }),
        metadata_context: fc.record({ filter_metadata: fc.dictionary(fc.string({ maxLength: 8 }), fc.record({ fields: fc.dictionary(fc.string({ maxLength: 8 }), fc.record({ stringValue: fc.string({ maxLength: 8 }) })) })) }),
      },
      { requiredKeys: [] },
    );
    fc.assert(
      fc.property(request, extra, (r, x) => {
        const msg = encode({ ...x, ...r } as ProcessingRequest);
        const b = (r as ProcessingRequest).request_body ?? (r as ProcessingRequest).response_body;
        expect(bytesBesideBody(msg, Infinity)).toBe(msg.length - (b?.body?.length ?? 0));
      }),
      { numRuns: 300 },
    );
  });

  test("a large body alone is all body; headers of millions of entries are not", () => {
    const body = encode({ request_body: { body: new Uint8Array(4 << 20), end_of_stream: true } });
    expect(bytesBesideBody(body, 1 << 20)).toBeLessThan(16);
    expect(bytesBesideBody(tinyHeaders(2 << 20), 1 << 20)).toBeGreaterThan(1 << 20);
  });

  test("a body field sent many times, or one body of many fields, counts all but its largest", () => {
    const one = len(4, len(1, enc.encode("x")));
    const many = Buffer.concat(Array.from({ length: 100 }, () => one));
    expect(bytesBesideBody(many, Infinity)).toBe(many.length - 1);
    const inner = Buffer.concat(Array.from({ length: 100 }, () => len(1, new Uint8Array(0))));
    expect(bytesBesideBody(len(4, inner), Infinity)).toBe(len(4, inner).length);
  });

  test("stops as soon as the bytes beside the body pass the limit", () => {
    expect(bytesBesideBody(tinyHeaders(10), 5)).toBe(tinyHeaders(10).length); // one field: all of it
    const many = Buffer.concat(Array.from({ length: 1000 }, () => len(4, new Uint8Array(0))));
    const n = bytesBesideBody(many, 100)!;
    expect(n).toBeGreaterThan(100);
    expect(n).toBeLessThan(110);
  });

  test("what protobufjs would read otherwise is unreadable: truncated, past the end, a field's wire type not its own", () => {
    const good = encode({ request_body: { body: enc.encode("hello"), end_of_stream: true } });
    for (let cut = 1; cut < good.length; cut++) expect(bytesBesideBody(good.subarray(0, cut), Infinity)).toBeUndefined();
    expect(bytesBesideBody(Buffer.from([0x22, 0x80]), Infinity)).toBeUndefined(); // a varint cut short
    expect(bytesBesideBody(Buffer.from([0x22, 10, 0x0a, 0]), Infinity)).toBeUndefined(); // length past the end
    expect(bytesBesideBody(Buffer.from([(10 << 3) | 2, 1, 0]), Infinity)).toBeUndefined(); // observability_mode (a bool) as bytes
    expect(bytesBesideBody(Buffer.from([(2 << 3) | 0, 1]), Infinity)).toBeUndefined(); // request_headers as a varint
    expect(bytesBesideBody(Buffer.from([(12 << 3) | 4]), Infinity)).toBeUndefined(); // an end group alone
    expect(bytesBesideBody(Buffer.from([(12 << 3) | 6]), Infinity)).toBeUndefined(); // no such wire type
    // Unknown fields of every wire type are skipped as protobufjs skips them.
    const unknown = Buffer.from([(12 << 3) | 0, 0x96, 1, (13 << 3) | 1, ...new Array(8).fill(0), (14 << 3) | 5, 0, 0, 0, 0, (15 << 3) | 3, (1 << 3) | 0, 1, (15 << 3) | 4]);
    expect(bytesBesideBody(Buffer.concat([unknown, good]), Infinity)).toBe(unknown.length + good.length - 5);
    expect(decode(Buffer.concat([unknown, good])).request_body?.body?.length).toBe(5);
  });

  test("a wire type that protobufjs would misread cannot hide headers inside a body", () => {
    // observability_mode sent as length-delimited: protobufjs reads its length as the bool and the next bytes as
    // fields, here a request_headers of millions of entries that the walk would have skipped as the bool's bytes.
    const hidden = tinyHeaders(1 << 20);
    const msg = Buffer.concat([Buffer.from([(10 << 3) | 2, ...varint(hidden.length)]), hidden]);
    expect(bytesBesideBody(msg, 1 << 20)).toBeUndefined();
  });
});

/** How many of `msg`'s prefixes (up to 64 bytes, as the transport looks) are said over `limit`, each checked against the whole. */
function earlyOvers(msg: Buffer, limit: number): number {
  const whole = bytesBesideBody(msg, limit);
  let early = 0;
  for (let cut = 0; cut <= Math.min(msg.length, 64); cut++) {
    if (!besideBodyOverSoFar(msg.subarray(0, cut), msg.length, limit)) continue;
    early++;
    expect(whole).toBeGreaterThan(limit);
  }
  return early;
}

describe("besideBodyOverSoFar", () => {
  test("headers of millions of entries say so in their first bytes; a large body never does", () => {
    const headers = tinyHeaders(2 << 20);
    // The field's tag and length (1 + 4 bytes) are enough, whatever follows.
    for (const n of [5, 6, 64]) expect(besideBodyOverSoFar(headers.subarray(0, n), headers.length, 1 << 20)).toBe(true);
    for (const n of [0, 1, 4]) expect(besideBodyOverSoFar(headers.subarray(0, n), headers.length, 1 << 20)).toBe(false);
    const body = encode({ request_body: { body: new Uint8Array(4 << 20), end_of_stream: true } });
    for (const n of [1, 6, 64]) expect(besideBodyOverSoFar(body.subarray(0, n), body.length, 1 << 20)).toBe(false);
    // A length past the message's end is left to the whole walk (which reads it as unreadable, not too large).
    expect(besideBodyOverSoFar(headers.subarray(0, 64), headers.length - 1, 1 << 20)).toBe(false);
  });

  test("says over only where bytesBesideBody of the whole message is over, for every prefix of any message", () => {
    const header = fc.record({ key: fc.string({ maxLength: 30 }), raw_value: fc.uint8Array({ maxLength: 30 }) });
    const headers = fc.record({ headers: fc.record({ headers: fc.array(header, { maxLength: 20 }) }) });
    const body = fc.record({ body: fc.uint8Array({ maxLength: 500 }), end_of_stream: fc.boolean() });
    const request = fc.oneof(fc.record({ request_headers: headers }), fc.record({ request_body: body }), fc.record({ response_body: body }));
    const extra = fc.record({ observability_mode: fc.boolean(), protocol_config: fc.record({ request_body_mode: fc.constantFrom("NONE", "FULL_DUPLEX_STREAMED") }) }, { requiredKeys: [] });
    let early = 0;
    fc.assert(
      fc.property(request, extra, fc.nat(300), fc.uint8Array({ maxLength: 8 }), (r, x, limit, junk) => {
        // Messages as the serializer writes them, and the same with bytes of junk after them (unreadable or not).
        const msg = encode({ ...x, ...r } as ProcessingRequest);
        early += earlyOvers(msg, limit) + earlyOvers(Buffer.concat([msg, junk]), limit);
      }),
      { numRuns: 300 },
    );
    expect(early).toBeGreaterThan(0);
  });

  test("and for messages of any fields, wire types and varints, well formed or not", () => {
    // Fields built by hand: any number, any wire type (a known field's own or not), varints up to 10 bytes (protobufjs
    // reads 5 and skips 5 more), lengths that may run past the message's end.
    const longVarint = (v: number, extra: number) => [...varint(v).slice(0, -1).map((b) => b | 128), varint(v).at(-1)! | (extra > 0 ? 128 : 0), ...Array.from({ length: extra }, (_, i) => (i < extra - 1 ? 128 : 0))];
    const field = fc.record({
      number: fc.integer({ min: 1, max: 14 }),
      wire: fc.constantFrom(0, 1, 2, 3, 4, 5, 6),
      value: fc.nat(400),
      pad: fc.integer({ min: 0, max: 5 }),
      short: fc.boolean(),
    }).map(({ number, wire, value, pad, short }) => {
      const tag = varint((number << 3) | wire);
      if (wire === 0) return [...tag, ...longVarint(value, pad)];
      if (wire === 1) return [...tag, ...new Array(8).fill(7)];
      if (wire === 5) return [...tag, ...new Array(4).fill(7)];
      if (wire === 2) return [...tag, ...longVarint(value, Math.min(pad, 3)), ...new Array(short ? value >> 1 : value).fill(0x0a)];
      return tag;
    });
    let early = 0;
    fc.assert(
      fc.property(fc.array(field, { maxLength: 6 }), fc.nat(200), (fields, limit) => {
        early += earlyOvers(Buffer.from(fields.flat()), limit);
      }),
      { numRuns: 2000 },
    );
    expect(early).toBeGreaterThan(0);
    // A request_headers whose length is written in 10 bytes (4 of value, 6 of continuation): read as protobufjs reads it, in both walks.
    const headers = tinyHeaders(2 << 20);
    const inner = headers.subarray(1 + varint(headers.length - 5).length);
    const padded = Buffer.concat([Buffer.from([0x12, ...longVarint(inner.length, 6)]), inner]);
    expect(besideBodyOverSoFar(padded.subarray(0, 64), padded.length, 1 << 20)).toBe(true);
    expect(bytesBesideBody(padded, 1 << 20)).toBeGreaterThan(1 << 20);
  });
});
