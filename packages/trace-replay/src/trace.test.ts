import { describe, expect, test } from "bun:test";
import { DEFAULT_TRACE_PATH, TraceFormatError, arrivalMs, arrivalTimes, loadTrace, parseTrace } from "./trace.ts";
import { SYNTH_VOCAB, blockTokens, recordTokens } from "./tokens.ts";

const line = (o: object) => JSON.stringify(o);

describe("trace loading", () => {
  test("parses records, sorts by timestamp, honours the limit", () => {
    const text = [
      line({ timestamp: 50, input_length: 600, output_length: 3, hash_ids: [0, 9] }),
      "",
      line({ timestamp: 10, input_length: 512, output_length: 1, hash_ids: [0] }),
      line({ timestamp: 90, input_length: 1, output_length: 1, hash_ids: [7] }),
    ].join("\n");
    const recs = parseTrace(text);
    expect(recs.map((r) => r.timestamp)).toEqual([10, 50, 90]);
    expect(recs[1]).toEqual({ timestamp: 50, inputLength: 600, outputLength: 3, hashIds: [0, 9] });
    expect(parseTrace(text, 2)).toHaveLength(2);
  });

  test("a record whose hash_ids do not cover input_length is rejected with its line number", () => {
    const text = line({ timestamp: 0, input_length: 1025, output_length: 1, hash_ids: [0, 1] });
    expect(() => parseTrace(text)).toThrow(TraceFormatError);
    expect(() => parseTrace(text)).toThrow(/line 1/);
  });

  test("time compression divides the offsets from the first record", () => {
    const [a, b] = parseTrace(
      [line({ timestamp: 1000, input_length: 1, output_length: 1, hash_ids: [0] }),
       line({ timestamp: 5000, input_length: 1, output_length: 1, hash_ids: [1] })].join("\n"),
    );
    expect(arrivalMs(b!, a!, 4)).toBe(1000);
    expect(arrivalMs(a!, a!, 4)).toBe(0);
  });

  test("spread arrivals space the records of one timestamp evenly until the next timestamp", () => {
    const recs = parseTrace([0, 0, 0, 0, 3000, 3000].map((timestamp, i) => line({ timestamp, input_length: 1, output_length: 1, hash_ids: [i] })).join("\n"));
    expect(arrivalTimes(recs, 10, "recorded")).toEqual([0, 0, 0, 0, 300, 300]);
    expect(arrivalTimes(recs, 10, "spread")).toEqual([0, 75, 150, 225, 300, 300]);
  });

  test("the Mooncake trace the repository carries loads whole", async () => {
    const recs = await loadTrace(DEFAULT_TRACE_PATH);
    expect(recs).toHaveLength(12_031);
    expect(recs[0]!.hashIds[0]).toBe(0);
  });
});

describe("token synthesis", () => {
  test("a hash id always expands to the same 512 tokens, distinct ids to different ones", () => {
    expect(blockTokens(42)).toEqual(blockTokens(42));
    expect(blockTokens(42)).not.toEqual(blockTokens(43));
    expect(blockTokens(0).every((t) => t < SYNTH_VOCAB)).toBe(true);
    expect(new Set(blockTokens(1)).size).toBeGreaterThan(400);
  });

  test("a record's prompt is its blocks' tokens, the last cut to input_length", () => {
    const rec = { timestamp: 0, inputLength: 700, outputLength: 1, hashIds: [5, 6] };
    const toks = recordTokens(rec);
    expect(toks.length).toBe(700);
    expect(toks.subarray(0, 512)).toEqual(blockTokens(5));
    expect(toks.subarray(512)).toEqual(blockTokens(6).subarray(0, 188));
  });
});
