import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { METADATA_NAMESPACE, responseEncoder, routedHeaders, SCORES_KEY, streamedBody, type ProcessingResponse, type Struct } from "./messages.ts";
import { loadProtos } from "./protos.ts";

const method = loadProtos().extProc.service.Process!;
const serialize = method.responseSerialize as (m: ProcessingResponse) => Buffer;
const encode = responseEncoder(serialize);
const joined = (m: ProcessingResponse) => {
  const out = encode(m);
  return Buffer.concat(Array.isArray(out) ? out : [out]);
};

describe("responseEncoder", () => {
  test("a streamed body encodes to the proto-loader serializer's bytes", () => {
    fc.assert(
      fc.property(
        fc.constantFrom("request_body" as const, "response_body" as const),
        // Sizes across the varint boundaries of every nesting level (127/128, 16383/16384).
        fc.oneof(fc.uint8Array({ maxLength: 300 }), fc.integer({ min: 16_370, max: 16_400 }).map((n) => new Uint8Array(n).fill(7))),
        fc.boolean(),
        (phase, body, eos) => {
          const m = streamedBody(phase, body, eos);
          // Compared as hex so that a failure prints bytes, not a 16 KB array.
          expect(joined(m).toString("hex")).toBe(serialize(m).toString("hex"));
        },
      ),
    );
  });

  test("the body is handed on, not copied", () => {
    const body = new Uint8Array(50_000);
    const parts = encode(streamedBody("request_body", body, true)) as Uint8Array[];
    expect(parts).toContain(body);
  });

  test("other answers go through the serializer", () => {
    const m = routedHeaders({ endpoint: "10.0.0.1:8000" });
    expect(Buffer.from(encode(m) as Uint8Array).toString("hex")).toBe(serialize(m).toString("hex"));
  });
});

describe("route metadata", () => {
  const lb = (m: ProcessingResponse) => (m.dynamic_metadata as Struct | undefined)?.fields?.[METADATA_NAMESPACE]?.structValue?.fields;

  test("endpoint scores go beside the destination; with none scored the key is left out, not sent empty (as llm-d)", () => {
    expect(lb(routedHeaders({ endpoint: "10.0.0.1:8000", scores: { "10.0.0.1:8000": -1.5 } }))?.[SCORES_KEY]).toEqual({
      structValue: { fields: { "10.0.0.1:8000": { numberValue: -1.5 } } },
    });
    const none = lb(routedHeaders({ endpoint: "10.0.0.1:8000", scores: {} }));
    expect(none).toBeDefined();
    expect(Object.keys(none!)).not.toContain(SCORES_KEY);
  });
});
