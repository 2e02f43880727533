// Live routing quality against a real mock worker, the EPP in the gateway's place of a full-duplex
// ext_proc stream: each pick's predicted cached tokens against what the worker's response reports, the
// observed TTFT, and what happens when the worker's cache is dropped behind the EPP's back.
import { afterAll, describe, expect, test } from "bun:test";
import { startMockWorker, type MockWorker } from "@kv-epp/mock-worker";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import type { EppHandle } from "../src/main.ts";
import { BLOCK, extProcClient, HOST, postJson, scrapeMetric, setHeader, startTestEpp, tokens, type Resp } from "./helpers.ts";

const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

const enc = new TextEncoder();
const h = (key: string, value: string) => ({ key, raw_value: enc.encode(value) });

type Exchange = { endpoint?: string; routedExplanation?: string; responseExplanation?: string; cachedTokens: number };

/**
 * What Envoy does for one request in FULL_DUPLEX_STREAMED both ways: headers and body to the EPP, the
 * request to the worker the EPP named, the worker's response headers and every SSE chunk through the
 * EPP as they arrive, end of stream last. With `responseMode` BUFFERED the response body goes whole
 * once the worker has finished, as one message with end of stream.
 */
async function gateway(epp: EppHandle, w: MockWorker, prompt: number[] | number[][], explain = false, responseMode: "FULL_DUPLEX_STREAMED" | "BUFFERED" = "FULL_DUPLEX_STREAMED"): Promise<Exchange> {
  const c = extProcClient(epp.ports.grpc);
  const s = c.open();
  const until = async (phase: keyof Resp): Promise<Resp> => {
    for (;;) {
      const r = await s.next();
      if (r[phase] != null) return r;
    }
  };
  try {
    s.send({
      request_headers: {
        headers: { headers: [h(":method", "POST"), h(":path", "/v1/completions"), h("content-type", "application/json"), ...(explain ? [h("x-kv-epp-explain", "1")] : [])] },
        end_of_stream: false,
      },
      protocol_config: { request_body_mode: "FULL_DUPLEX_STREAMED", response_body_mode: responseMode },
    });
    const body = JSON.stringify({ prompt, max_tokens: 3, stream: true, stream_options: { include_usage: true } });
    s.send({ request_body: { body: enc.encode(body), end_of_stream: true } });
    const routed = (await until("request_headers")).request_headers?.response;
    const res = await fetch(`${w.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body });
    s.send({ response_headers: { headers: { headers: [h(":status", String(res.status)), h("content-type", res.headers.get("content-type") ?? "")] }, end_of_stream: false } });
    const answered = (await until("response_headers")).response_headers?.response;
    let text = "";
    if (responseMode === "BUFFERED") {
      const whole = new Uint8Array(await res.arrayBuffer());
      text = new TextDecoder().decode(whole);
      s.send({ response_body: { body: whole, end_of_stream: true } });
      await until("response_body");
    } else {
      for await (const chunk of res.body!) {
        text += new TextDecoder().decode(chunk);
        s.send({ response_body: { body: chunk, end_of_stream: false } });
        await until("response_body");
      }
      s.send({ response_body: { body: new Uint8Array(0), end_of_stream: true } });
      await until("response_body");
    }
    const usage = /"cached_tokens":(\d+)/.exec(text);
    return {
      endpoint: setHeader(routed, "x-gateway-destination-endpoint"),
      routedExplanation: setHeader(routed, "x-kv-epp-decision"),
      responseExplanation: setHeader(answered, "x-kv-epp-decision"),
      cachedTokens: usage ? Number(usage[1]) : 0,
    };
  } finally {
    s.end();
    c.close();
  }
}

/** A mock worker "mock" at `ip` and an EPP routing to it, both stopped after the file. */
async function workerAndEpp(ip: string, flags: string[] = []): Promise<{ w: MockWorker; epp: EppHandle }> {
  const w = await startMockWorker({ listen: ip, port: 0, kvEvents: `tcp://${ip}:5557`, speed: 0.2, blockSize: BLOCK, capacityBlocks: 200, logLevel: "silent" });
  cleanups.push(() => w.close());
  const epp = await startTestEpp([{ id: "mock", address: `${ip}:8000`, kvEvents: `tcp://${ip}:5557` }], { flags });
  cleanups.push(() => epp.stop({ graceMs: 200 }));
  return { w, epp };
}

/** The mock rank's overlap of `p` in the EPP's index (POST /score). */
async function overlapIn(epp: EppHandle, p: number[]): Promise<number> {
  return (await postJson(`http://${HOST}:${epp.ports.selection}/score`, { token_ids: p })).body.scores.mock?.["0"] ?? 0;
}

/** What a PUB sends before the subscription arrives is lost: prompts straight to the worker until one shows. */
async function subscribed(w: MockWorker, epp: EppHandle): Promise<void> {
  await waitFor(async () => {
    const p = tokens(BLOCK, 1000 + Math.floor(Math.random() * 1e6));
    await fetch(`${w.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: p, max_tokens: 1 }) });
    await Bun.sleep(20);
    return (await overlapIn(epp, p)) === 1;
  }, { message: "the EPP subscribed to the worker" });
}

describe("routing quality, live", () => {
  test("predicted and reported cached tokens agree while the index holds; a cache dropped without an event shows as mispredictions", async () => {
    const { w, epp } = await workerAndEpp(`${LOOPBACK}.4.41`);
    const selection = `http://${HOST}:${epp.ports.selection}`;
    const metrics = `http://${HOST}:${epp.ports.metrics}`;
    const overlap = (p: number[]) => overlapIn(epp, p);
    await subscribed(w, epp);

    const series = (name: string) => scrapeMetric(metrics, `${name}{worker="mock",dp_rank="0"}`);
    // Four full blocks and a partial one.
    const prompt = tokens(BLOCK * 4 + 3, 7);
    // Cold: nothing predicted, nothing cached (vLLM's streamed usage chunk then has no prompt_tokens_details).
    const cold = await gateway(epp, w, prompt);
    expect(cold.cachedTokens).toBe(0);
    await waitFor(async () => (await overlap(prompt)) === 4, { message: "the prompt's blocks reached the index" });

    const warm = await gateway(epp, w, prompt, true);
    expect(warm.cachedTokens).toBe(4 * BLOCK);
    await waitFor(async () => (await series("dynamo_epp_cached_tokens_predictions_total")) !== undefined);
    const predictions = (await series("dynamo_epp_cached_tokens_predictions_total"))!;
    // Present at 0 once the worker has predictions (a ratio of the counters reads 0, not no data).
    expect(await series("dynamo_epp_cached_tokens_mispredictions_total")).toBe(0);
    // Streamed responses: the first body chunk timed each one's TTFT.
    expect(await scrapeMetric(metrics, `dynamo_epp_observed_ttft_seconds_count{worker="mock",dp_rank="0"}`)).toBeGreaterThanOrEqual(2);

    // Why this worker: on the routed request and on the response, the chosen rank with its overlap.
    expect(warm.routedExplanation).toBeDefined();
    expect(warm.responseExplanation).toBe(warm.routedExplanation!);
    expect(warm.routedExplanation).toMatch(/^chosen: worker=mock dp_rank=0 overlap=4\/4 predicted_ttft_ms=\d+(\.\d)? cost=\S+; runner_up: none$/);
    expect(cold.routedExplanation).toBeUndefined();

    // The worker drops its cache and says nothing: the index still claims the blocks.
    const dropped = await fetch(`${w.url}/admin/faults`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ action: "drop-cache" }) });
    expect(dropped.status).toBe(200);
    expect(await overlap(prompt)).toBe(4);
    const drifted = await gateway(epp, w, prompt);
    expect(drifted.cachedTokens).toBe(0);
    await waitFor(async () => (await series("dynamo_epp_cached_tokens_mispredictions_total")) === 1, { message: "the misprediction was counted" });
    expect(await series("dynamo_epp_cached_tokens_predictions_total")).toBe(predictions + 1);
    // The error histogram took +64 (predicted 64, actual 0) on top of the exact prediction's 0.
    const sum = await scrapeMetric(metrics, "dynamo_epp_cached_tokens_prediction_error_sum");
    expect(sum).toBe(4 * BLOCK);
    expect(await scrapeMetric(metrics, `dynamo_epp_cached_tokens_prediction_error_bucket{le="0"}`)).toBe(1);

    const workers = (await (await fetch(`${selection}/workers`)).json()) as { prediction: { samples: number; mispredicted: number; accuracy: number }; observed_ttft_ms: number }[];
    expect(workers[0]!.prediction).toMatchObject({ samples: 2, mispredicted: 1, accuracy: 0.5 });
    expect(workers[0]!.observed_ttft_ms).toBeGreaterThan(0);
  });
  test("the eviction regret: 0 while the worker's cache holds what it is sent, up once it stores again blocks it evicted", async () => {
    const { w, epp } = await workerAndEpp(`${LOOPBACK}.4.44`);
    const metrics = `http://${HOST}:${epp.ports.metrics}`;
    await subscribed(w, epp);
    const send = (prompt: number[]) => fetch(`${w.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt, max_tokens: 1 }) });
    // Two prompts of 150 blocks each on a 200-block cache: the second evicts most of the first.
    const a = tokens(BLOCK * 150, 31), b = tokens(BLOCK * 150, 32);
    await send(a);
    await waitFor(async () => (await overlapIn(epp, a)) === 150, { message: "the first prompt indexed" });
    expect(await scrapeMetric(metrics, "dynamo_epp_kv_eviction_regret")).toBe(0);
    await send(b);
    await waitFor(async () => (await overlapIn(epp, b)) === 150, { message: "the second prompt indexed" });
    expect(await scrapeMetric(metrics, "dynamo_epp_kv_eviction_regret")).toBe(0);
    // The first again: its evicted blocks are computed and stored a second time.
    await send(a);
    await waitFor(async () => (await overlapIn(epp, a)) === 150, { message: "the first prompt indexed again" });
    const regret = (await scrapeMetric(metrics, "dynamo_epp_kv_eviction_regret"))!;
    expect(regret).toBeGreaterThan(0);
    expect(regret).toBeLessThan(0.02);
  });
  test("a batch of prompts is routed by its first; its usage adds up the batch, so it is not compared with the prediction", async () => {
    const { w, epp } = await workerAndEpp(`${LOOPBACK}.4.43`);
    const metrics = `http://${HOST}:${epp.ports.metrics}`;
    await subscribed(w, epp);
    const first = tokens(BLOCK * 2 + 3, 21), second = tokens(BLOCK * 2 + 3, 22);
    for (const prompt of [first, second])
      await fetch(`${w.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt, max_tokens: 1 }) });
    await waitFor(async () => (await overlapIn(epp, first)) === 2 && (await overlapIn(epp, second)) === 2, { message: "both prompts indexed" });
    const batch = await gateway(epp, w, [first, second]);
    // vLLM's usage for a batch adds up its prompts: twice what the route's prediction (the first's) could say.
    expect(batch.cachedTokens).toBe(4 * BLOCK);
    await waitFor(async () => (await scrapeMetric(metrics, `dynamo_epp_cached_tokens_unscored_total{reason="batched_prompts"}`)) === 1, { message: "the batch counted as unscored" });
    const single = await gateway(epp, w, first);
    expect(single.cachedTokens).toBe(2 * BLOCK);
    await waitFor(async () => (await scrapeMetric(metrics, `dynamo_epp_cached_tokens_predictions_total{worker="mock",dp_rank="0"}`)) === 1, { message: "the single prompt compared" });
    expect(await scrapeMetric(metrics, `dynamo_epp_cached_tokens_mispredictions_total{worker="mock",dp_rank="0"}`)).toBe(0);
    expect(await scrapeMetric(metrics, `dynamo_epp_observed_ttft_seconds_count{worker="mock",dp_rank="0"}`)).toBe(1);
  });
  test("a response body the gateway buffers (BUFFERED) comes whole at its end: its usage counts, no TTFT is taken from it; --explain explains unasked", async () => {
    const { w, epp } = await workerAndEpp(`${LOOPBACK}.4.42`, ["--explain"]);
    const metrics = `http://${HOST}:${epp.ports.metrics}`;
    const prompt = tokens(BLOCK * 2 + 3, 11);
    // Warm the worker straight, so the routed request's usage reports cached tokens (prompt_tokens_details present).
    await fetch(`${w.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt, max_tokens: 1 }) });
    const buffered = await gateway(epp, w, prompt, false, "BUFFERED");
    expect(buffered.cachedTokens).toBe(2 * BLOCK);
    // The request sent no x-kv-epp-explain.
    expect(buffered.routedExplanation).toStartWith("chosen: worker=mock dp_rank=0 ");
    expect(buffered.responseExplanation).toBe(buffered.routedExplanation!);
    await waitFor(async () => (await scrapeMetric(metrics, `dynamo_epp_cached_tokens_predictions_total{worker="mock",dp_rank="0"}`)) === 1, { message: "the buffered response's usage was read" });
    expect(await scrapeMetric(metrics, `dynamo_epp_observed_ttft_seconds_count{worker="mock",dp_rank="0"}`)).toBeUndefined();
    // The same SSE response streamed through the EPP is timed.
    await gateway(epp, w, prompt);
    await waitFor(async () => (await scrapeMetric(metrics, `dynamo_epp_observed_ttft_seconds_count{worker="mock",dp_rank="0"}`)) === 1, { message: "the streamed response was timed" });
  });
});
