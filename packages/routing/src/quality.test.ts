import { describe, expect, test } from "bun:test";
import { hittableBlocks, LatencyModel, uncachedTokens } from "./latency.ts";
import type { Decision, ScoredCandidate } from "./picker.ts";
import type { WorkerRef } from "@kv-epp/protocol";
import { NO_METRICS } from "./ports.ts";
import { calibrationSample, predictionOf, RoutingQuality, type Observed, type Prediction } from "./quality.ts";

const P: Prediction = { workerKey: "w\u00000", workerId: "w", dpRank: 0, predictedCachedTokens: 64, promptTokens: 100, blockSize: 16, waiting: 0, aheadTokens: 0, lowerBound: false };
const bytes = (s: string) => new TextEncoder().encode(s);

function run(q: RoutingQuality, chunks: string[], contentType = "text/event-stream", p = P): Observed | undefined {
  const w = q.watch(p, 0);
  w.headers(contentType, true);
  chunks.forEach((c, i) => w.body(bytes(c), 10 + i));
  return w.end();
}

describe("prediction", () => {
  const picked = (overlap: number, promptTokens: number): Extract<Decision, { kind: "picked" }> => {
    const chosen: ScoredCandidate = {
      candidate: { workerId: "w", dpRank: 0, key: P.workerKey, endpoint: "10.0.0.1:8000", rankHeader: undefined },
      overlap, pendingOverlap: 0, cost: 0, waiting: 0, unexplainedWaiting: 0, aheadTokens: 32, predictedTtftMs: 0, openEnded: false,
    };
    return { kind: "picked", chosen, model: "m", blockSize: 16, requestBlocks: Math.floor(promptTokens / 16), promptTokens, scored: [chosen] };
  };

  test("the predicted cached tokens are the overlap's, at most what vLLM hits: a fully cached prompt of whole blocks computes its last block again", () => {
    expect(predictionOf(picked(4, 67)).predictedCachedTokens).toBe(64);
    expect(predictionOf(picked(4, 67)).aheadTokens).toBe(32);
    expect(predictionOf(picked(2, 67)).predictedCachedTokens).toBe(32);
    // 64 tokens, all 4 blocks in the index: vLLM's hit stops at 63 tokens, 3 whole blocks.
    expect(predictionOf(picked(4, 64)).predictedCachedTokens).toBe(48);
    expect(predictionOf(picked(3, 64)).predictedCachedTokens).toBe(48);
    expect(predictionOf(picked(0, 0)).predictedCachedTokens).toBe(0);
  });
});

describe("response watch", () => {
  test("the final SSE usage chunk's cached_tokens is read even when split across body chunks", () => {
    const q = new RoutingQuality(NO_METRICS);
    run(q, ['data: {"choices":[{"text":" a"}]}\n\ndata: {"choices":[],"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tok', 'ens":6', '4}}}\n\ndata: [DONE]\n\n']);
    expect(q.accuracy(P.workerKey)).toMatchObject({ samples: 1, mispredicted: 0, meanAbsErrorTokens: 0 });
  });

  test("a JSON body works too; a null prompt_tokens_details counts as 0 once the worker has shown it reports them", () => {
    const q = new RoutingQuality(NO_METRICS);
    const miss = '{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":3,"prompt_tokens_details":null}}';
    run(q, [miss], "application/json");
    // Nothing known yet: a worker without --enable-prompt-tokens-details writes null on every response.
    expect(q.accuracy(P.workerKey).samples).toBe(0);
    run(q, ['{"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":48}}}'], "application/json");
    run(q, [miss], "application/json");
    expect(q.accuracy(P.workerKey)).toMatchObject({ samples: 2, mispredicted: 1, meanAbsErrorTokens: (16 + 64) / 2 });
  });

  test("a rank that left the pool is forgotten: what was learnt of it, and its figures", () => {
    const forgotten: WorkerRef[] = [];
    const q = new RoutingQuality({ ...NO_METRICS, forgetRank: (r) => void forgotten.push(r) });
    run(q, ['{"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":64}}}'], "application/json");
    expect(q.accuracy(P.workerKey).samples).toBe(1);
    expect(q.reportsDetails(P.workerKey)).toBe(true);
    q.forget({ workerId: "w", dpRank: 0 });
    expect(q.accuracy(P.workerKey).samples).toBe(0);
    expect(q.reportsDetails(P.workerKey)).toBe(false);
    expect(forgotten).toEqual([{ workerId: "w", dpRank: 0 }]);
  });

  test("a streamed miss as vLLM writes it (no prompt_tokens_details in the final usage chunk) counts as 0 once the worker has reported details; a stream cut before that chunk says nothing", () => {
    const q = new RoutingQuality(NO_METRICS);
    const text = 'data: {"choices":[{"index":0,"text":" a"}],"usage":{"prompt_tokens":100,"completion_tokens":1,"total_tokens":101}}\n\n';
    const miss = [text, 'data: {"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":1,"total_tokens":101}}\n\n', "data: [DONE]\n\n"];
    const seen = run(q, miss);
    // A worker without --enable-prompt-tokens-details writes every usage chunk this way: nothing known,
    // and its TTFT sample keeps the predicted cached tokens (64 of 100: 36 uncached).
    expect(q.accuracy(P.workerKey).samples).toBe(0);
    expect(calibrationSample(seen!)).toMatchObject({ ttftMs: 10, uncachedTokens: 36 });
    run(q, [text, 'data: {"choices":[],"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":64}}}\n\n']);
    expect(q.accuracy(P.workerKey)).toMatchObject({ samples: 1, mispredicted: 0 });
    run(q, miss);
    expect(q.accuracy(P.workerKey)).toMatchObject({ samples: 2, mispredicted: 1, meanAbsErrorTokens: 32 });
    // continuous_usage_stats puts usage on every chunk: a stream that ends before the final one tells nothing.
    run(q, [text, text]);
    expect(q.accuracy(P.workerKey).samples).toBe(2);
  });

  test("cached_tokens 0 (vLLM releases that always write the details) is a reported miss at once", () => {
    const q = new RoutingQuality(NO_METRICS);
    run(q, ['data: {"choices":[],"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":0}}}\n\n', "data: [DONE]\n\n"]);
    expect(q.accuracy(P.workerKey)).toMatchObject({ samples: 1, mispredicted: 1, meanAbsErrorTokens: 64 });
  });

  test("a response without usage says nothing; an escaped key inside generated text is not usage", () => {
    const q = new RoutingQuality(NO_METRICS);
    run(q, ['data: {"choices":[{"text":"\\"cached_tokens\\": 5"}]}\n\n', "data: [DONE]\n\n"]);
    expect(q.accuracy(P.workerKey).samples).toBe(0);
  });

  test("TTFT is observed for streamed responses only: the calibration sample of the latency model", () => {
    const q = new RoutingQuality(NO_METRICS);
    expect(run(q, ['{"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":64}}}'], "application/json")).toBeUndefined();
    expect(q.accuracy(P.workerKey).meanTtftMs).toBeNull();
    const seen = run(q, ['data: {"choices":[]}\n\n', 'data: {"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":64}}}\n\n']);
    // The first chunk came 10 ms after the decision.
    expect(q.accuracy(P.workerKey).meanTtftMs).toBe(10);
    expect(calibrationSample(seen!)).toEqual({ ttftMs: 10, uncachedTokens: 36, aheadTokens: 0, waiting: 0 });
  });
});

describe("a prediction made on a known prefix the worker holds whole (a lower bound)", () => {
  const bound: Prediction = { ...P, lowerBound: true };
  const usage = (cached: number) => [`data: {"choices":[],"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":${cached}}}}\n\n`];

  test("finding more cached than predicted is no misprediction (its error still counts); finding less is, as for any prediction", () => {
    const q = new RoutingQuality(NO_METRICS);
    run(q, usage(96), "text/event-stream", bound);
    run(q, usage(64), "text/event-stream", bound);
    expect(q.accuracy(P.workerKey)).toMatchObject({ samples: 2, mispredicted: 0, meanAbsErrorTokens: 16 });
    run(q, usage(32), "text/event-stream", bound);
    expect(q.accuracy(P.workerKey)).toMatchObject({ samples: 3, mispredicted: 1, meanAbsErrorTokens: 64 / 3 });
    // The same response against an exact prediction is off by two blocks.
    run(q, usage(96));
    expect(q.accuracy(P.workerKey)).toMatchObject({ samples: 4, mispredicted: 2 });
  });

  test("it calibrates the latency model only with the cached tokens the worker reported", () => {
    const q = new RoutingQuality(NO_METRICS);
    const reported = run(q, ['data: {"choices":[]}\n\n', ...usage(96)], "text/event-stream", bound);
    expect(calibrationSample(reported!)).toMatchObject({ uncachedTokens: 4 });
    // A worker that never reported the details.
    const silent = run(new RoutingQuality(NO_METRICS), ['data: {"choices":[]}\n\n', 'data: {"choices":[],"usage":{"prompt_tokens":100}}\n\n'], "text/event-stream", bound);
    expect(silent).toBeDefined();
    expect(calibrationSample(silent!)).toBeUndefined();
  });
});

describe("latency model", () => {
  test("fits one line for the pool, base + rate x (prefill ahead + uncached tokens), from observations, and the queue term from queued ones", () => {
    const m = new LatencyModel({ baseMs: 1, msPerToken: 1, msPerWaiting: 1 });
    expect(m.predictTtftMs({ uncachedTokens: 100, aheadTokens: 0, waiting: 0 })).toBe(101);
    expect(m.predictTtftMs({ uncachedTokens: 100, aheadTokens: 50, waiting: 2 })).toBe(153);
    for (let i = 0; i < 200; i++) {
      const x = (i % 10) * 1000;
      // Half the samples' prefill is another request's, ahead of them: the same rate.
      const ahead = i % 2 === 0 ? x / 2 : 0;
      m.observe({ uncachedTokens: x - ahead, aheadTokens: ahead, waiting: 0, ttftMs: 20 + 0.05 * x });
    }
    const p = m.params();
    expect(p.baseMs).toBeCloseTo(20, 6);
    expect(p.msPerToken).toBeCloseTo(0.05, 9);
    expect(m.predictTtftMs({ uncachedTokens: 100, aheadTokens: 900, waiting: 0 })).toBeCloseTo(70, 6);
    for (let i = 0; i < 50; i++) m.observe({ uncachedTokens: 1000, aheadTokens: 0, waiting: 2, ttftMs: 20 + 50 + 2 * 300 });
    expect(m.params().msPerWaiting).toBeGreaterThan(250);
    // A model that has seen nothing keeps the priors.
    expect(new LatencyModel({ baseMs: 1, msPerToken: 1, msPerWaiting: 1 }).predictTtftMs({ uncachedTokens: 100, aheadTokens: 0, waiting: 0 })).toBe(101);
  });
});

describe("uncached tokens (vLLM's last-token rule)", () => {
  test("a worker holding the whole prompt still prefills from the last whole block its hit may cover", () => {
    // 32 tokens of 16-token blocks, both held: vLLM hits at most floor(31 / 16) = 1 block
    expect(hittableBlocks(32, 16)).toBe(1);
    expect(uncachedTokens(32, 2, 16)).toBe(16);
    // 33 tokens: both blocks hit, the 33rd token is prefilled
    expect(uncachedTokens(33, 2, 16)).toBe(1);
    expect(uncachedTokens(33, 0, 16)).toBe(33);
    expect(uncachedTokens(1, 0, 16)).toBe(1);
    expect(uncachedTokens(0, 0, 16)).toBe(0);
    // an overlap beyond the prompt (in-flight prefixes of a longer request) is capped the same way
    expect(uncachedTokens(40, 5, 16)).toBe(8);
  });
});
