import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startMockWorker, type MockWorker } from "@kv-epp/mock-worker";
import { freePort, waitFor, type ProcessHandle, LOOPBACK } from "@kv-epp/testkit";
import { expectRefusedPrefillAnswered502, expectStreamedChatPrefilledRemotely, failures, metric, post, startSidecarProcess } from "./process-support.ts";

// `bun run pd-sidecar --kv-connector mooncake` as a process in front of a decode-role mock worker in Mooncake mode,
// a prefill-role one as the prefiller: the engine id from the prefill's bootstrap server, both legs at once paired
// by transfer_id, the workers' ground truth showing where the prompt was computed; then between capturing servers,
// for the exact bodies and headers.

const P = `${LOOPBACK}.2.140`, D = `${LOOPBACK}.2.141`, S = `${LOOPBACK}.2.142`, DOWN = `${LOOPBACK}.2.143`, C = `${LOOPBACK}.2.144`;
const common = { port: 0, speed: 0, blockSize: 16, model: "mock/model", logLevel: "silent" as const, kvConnector: "mooncake" as const };
let prefill: MockWorker, decode: MockWorker;
const sidecars: ProcessHandle[] = [];

const startSidecar = (host: string, decoder: string, extra: string[]) => startSidecarProcess(host, decoder, ["--kv-connector", "mooncake", ...extra], sidecars);
afterAll(async () => {
  await Promise.all(sidecars.map((s) => s.kill()));
  await Promise.all([prefill?.close(), decode?.close()]);
});

const QUERIES = `mock_worker_mooncake_bootstrap_queries_total{model_name="mock/model"}`;

describe("the P/D sidecar with --kv-connector mooncake, between Mooncake mock workers", () => {
  let url: string;
  beforeAll(async () => {
    prefill = await startMockWorker({ ...common, listen: P, kvEvents: `tcp://${P}:0`, role: "prefill", mooncakeBootstrapPort: 0 });
    decode = await startMockWorker({ ...common, listen: D, kvEvents: `tcp://${D}:0`, role: "decode" });
    url = await startSidecar(S, decode.url, ["--mooncake-bootstrap-port", String(prefill.bootstrapPort)]);
  });

  test("a streamed chat: the prefill worker computes the prompt, the decode worker takes its blocks by transfer id and answers", async () => {
    await expectStreamedChatPrefilledRemotely(url, prefill, decode, "how does a decode worker find its prefill's engine? ".repeat(8));
    // The prefill's blocks were freed once taken.
    await waitFor(async () => (await metric(`${prefill.url}/metrics`, `mock_worker_kv_transfer_held_requests{model_name="mock/model",engine="0"}`)) === 0, { message: "nothing held" });
    expect(await metric(`${prefill.url}/metrics`, `mock_worker_mooncake_transfers_total{model_name="mock/model"}`)).toBeGreaterThanOrEqual(1);
  });

  test("a completion too, JSON; the engine id is asked once, not per request", async () => {
    const ask = async (offset: number) => {
      const res = await post(url, "/v1/completions", { model: "mock/model", prompt: Array.from({ length: 40 }, (_, i) => offset + i), max_tokens: 3 }, new URL(prefill.url).host);
      expect(res.status).toBe(200);
      return (await res.json()) as any;
    };
    const body = await ask(900);
    expect(body.usage).toMatchObject({ prompt_tokens: 40, completion_tokens: 3, prompt_tokens_details: { cached_tokens: 39 } });
    expect(body.kv_transfer_params).toBeNull();
    const queries = await metric(`${prefill.url}/metrics`, QUERIES);
    expect(queries).toBeGreaterThanOrEqual(1);
    expect((await ask(2000)).usage.prompt_tokens_details).toEqual({ cached_tokens: 39 });
    // Neither the sidecar nor the decode worker asked the bootstrap server again.
    expect(await metric(`${prefill.url}/metrics`, QUERIES)).toBe(queries);
  });

  test("a prefill worker whose bootstrap server is down: a 502 naming it, counted, and no leg sent", async () => {
    const before = await failures(url, "bootstrap_unreachable");
    const decoded = await metric(`${decode.url}/metrics`, `vllm:request_success_total{model_name="mock/model",engine="0",finished_reason="length"}`);
    const res = await post(url, "/v1/completions", { model: "mock/model", prompt: "nobody prefills this", max_tokens: 2 }, `${DOWN}:${await freePort(DOWN)}`);
    expect(res.status).toBe(502);
    expect(((await res.json()) as any).error.message).toContain(`Mooncake bootstrap server http://${DOWN}:${prefill.bootstrapPort} unreachable`);
    expect(await failures(url, "bootstrap_unreachable")).toBe(before + 1);
    expect(await metric(`${decode.url}/metrics`, `vllm:request_success_total{model_name="mock/model",engine="0",finished_reason="length"}`)).toBe(decoded);
  });

  test("a prefill leg refused while the decode worker waits for the transfer: a 502 naming it at once, counted once", async () => {
    // The prefill worker's host: its bootstrap server answers, so the decode worker waits for the transfer id (up
    // to VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT, 480 s) unless the sidecar cuts it.
    await expectRefusedPrefillAnswered502(url, P);
  });
});

describe("the P/D sidecar with --kv-connector mooncake, between capturing servers", () => {
  type Seen = { body: any; headers: Headers };
  const seen: { prefill: Seen[]; decode: Seen[] } = { prefill: [], decode: [] };
  let queries = 0;
  /** decode requests the sidecar cut; those still waiting, and the first one's arrival */
  let decodeCut = 0, waiting = 0;
  let waitArrived = Promise.withResolvers<void>();
  let servers: ReturnType<typeof Bun.serve>[] = [];
  let url: string, prefiller: string, bootstrapPort: number;
  beforeAll(async () => {
    const answer = { id: "x", object: "chat.completion", choices: [{ index: 0, message: { role: "assistant", content: "hi" }, finish_reason: "length" }] };
    // The prompt says how a leg answers: the prefill fails with a 503 ("prefill 503"); the decode waits for KV
    // that never comes ("decode waits"), or answers an error ("decode 429", "decode 500").
    const capture = (into: Seen[], role: "prefill" | "decode") => Bun.serve({
      hostname: C, port: 0, idleTimeout: 0,
      fetch: async (req) => {
        const body: any = await req.json();
        into.push({ body, headers: req.headers });
        const says = String(body.prompt ?? "");
        if (role === "prefill" && says.includes("prefill 503")) {
          // Fails once its decode leg waits, so that the cut is seen.
          await waitArrived.promise;
          return Response.json({ error: { message: "overloaded" } }, { status: 503 });
        }
        if (role === "decode" && says.includes("decode waits")) {
          // Cut while its body was read, the abort event has been and gone.
          if (req.signal.aborted) decodeCut++;
          else {
            waiting++;
            req.signal.addEventListener("abort", () => (decodeCut++, waiting--));
          }
          waitArrived.resolve();
          return new Promise<Response>(() => {});
        }
        const status = role === "decode" ? /decode (\d{3})/.exec(says)?.[1] : undefined;
        if (status) return Response.json({ error: { message: "no" } }, { status: Number(status) });
        return Response.json(answer);
      },
    });
    const bootstrap = Bun.serve({
      hostname: C, port: 0,
      fetch: (req) => {
        if (new URL(req.url).pathname !== "/query") return new Response(null, { status: 404 });
        queries++;
        return Response.json({
          "0": { engine_id: "engine-dp0", worker_addr: { "0": { "0": "tcp://10.0.0.1:5000" } } },
          "1": { engine_id: "engine-dp1", worker_addr: { "0": { "0": "tcp://10.0.0.2:5000" } } },
        });
      },
    });
    const [pserver, dserver] = [capture(seen.prefill, "prefill"), capture(seen.decode, "decode")];
    servers = [pserver, dserver, bootstrap];
    prefiller = `${C}:${pserver.port}`;
    bootstrapPort = bootstrap.port!;
    url = await startSidecar(`${LOOPBACK}.2.145`, `http://${C}:${dserver.port}`, ["--mooncake-bootstrap-port", String(bootstrapPort)]);
  });
  afterAll(() => {
    for (const s of servers) void s.stop(true);
  });

  test("both legs carry one transfer id; the prefill is pinned to the EPP's rank, whose engine id the decode gets", async () => {
    const client = { model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 7, stream: true, stream_options: { include_usage: true } };
    const headers = { "x-kv-epp-prefill-data-parallel-rank": "1", "x-data-parallel-rank": "0", "x-request-id": "r-1" };
    expect((await post(url, "/v1/chat/completions", client, prefiller, headers)).status).toBe(200);
    await waitFor(() => seen.prefill.length === 1, { message: "the prefill leg" });
    const [p, d] = [seen.prefill[0]!, seen.decode[0]!];
    const transferId = p.body.kv_transfer_params.transfer_id;
    expect(transferId).toMatch(/^xfer-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
    const { stream_options: _, ...unstreamed } = client;
    // Every chat limit capped, as the NIXL prefill leg (prefill-request.ts).
    expect(p.body).toEqual({ ...unstreamed, max_tokens: 1, max_completion_tokens: 1, stream: false, kv_transfer_params: { do_remote_prefill: false, do_remote_decode: true, transfer_id: transferId } });
    expect(d.body).toEqual({
      ...client,
      kv_transfer_params: { do_remote_prefill: true, do_remote_decode: false, transfer_id: transferId, remote_bootstrap_addr: `http://${C}:${bootstrapPort}`, remote_engine_id: "engine-dp1" },
    });
    expect(p.headers.get("x-data-parallel-rank")).toBe("1");
    expect(d.headers.get("x-data-parallel-rank")).toBe("0");
    for (const h of [p.headers, d.headers]) {
      expect(h.get("x-request-id")).toBe("r-1");
      expect(h.get("x-prefiller-host-port")).toBeNull();
      expect(h.get("x-kv-epp-prefill-data-parallel-rank")).toBeNull();
    }
  });

  test("without the EPP's rank, one drawn from the map; the map asked once for every request", async () => {
    const asked = queries;
    const from = seen.prefill.length;
    for (let i = 0; i < 6; i++) expect((await post(url, "/v1/completions", { model: "m", prompt: `p${i}`, max_tokens: 2 }, prefiller)).status).toBe(200);
    await waitFor(() => seen.prefill.length === from + 6, { message: "six prefill legs" });
    const ranks = new Set<string>();
    for (let i = from; i < from + 6; i++) {
      const rank = seen.prefill[i]!.headers.get("x-data-parallel-rank")!;
      ranks.add(rank);
      const transferId = seen.prefill[i]!.body.kv_transfer_params.transfer_id;
      const d = seen.decode.find((x) => x.body.kv_transfer_params.transfer_id === transferId)!;
      expect(d.body.kv_transfer_params.remote_engine_id).toBe(`engine-dp${rank}`);
    }
    for (const r of ranks) expect(["0", "1"]).toContain(r);
    expect(queries).toBe(asked === 0 ? 1 : asked);
  });

  test("a rank the map lacks: served on a drawn rank, counted, and the map asked again once, not per request", async () => {
    const asked = queries;
    const fallbacks = () => metric(`${url}/sidecar/metrics`, "pd_sidecar_prefill_rank_fallbacks_total");
    const before = await fallbacks();
    const from = seen.prefill.length;
    for (let i = 0; i < 3; i++) {
      const res = await post(url, "/v1/completions", { model: "m", prompt: `r${i}`, max_tokens: 2 }, prefiller, { "x-kv-epp-prefill-data-parallel-rank": "5" });
      expect(res.status).toBe(200);
    }
    await waitFor(() => seen.prefill.length === from + 3, { message: "three prefill legs" });
    for (let i = from; i < from + 3; i++) {
      const rank = seen.prefill[i]!.headers.get("x-data-parallel-rank")!;
      expect(["0", "1"]).toContain(rank);
      const transferId = seen.prefill[i]!.body.kv_transfer_params.transfer_id;
      expect(seen.decode.find((x) => x.body.kv_transfer_params.transfer_id === transferId)!.body.kv_transfer_params.remote_engine_id).toBe(`engine-dp${rank}`);
    }
    expect(await fallbacks()).toBe(before + 3);
    expect(await failures(url, "bootstrap_answer")).toBe(0);
    expect(queries).toBe(asked + 1);
  });

  test("a decode worker's 4xx keeps the engine map; a 5xx drops it", async () => {
    const asked = queries;
    const ask = (prompt: string) => post(url, "/v1/completions", { model: "m", prompt, max_tokens: 2 }, prefiller);
    expect((await ask("decode 429")).status).toBe(429);
    expect((await ask("decode 400")).status).toBe(400);
    expect((await ask("fine")).status).toBe(200);
    expect(queries).toBe(asked);
    expect((await ask("decode 500")).status).toBe(500);
    expect((await ask("fine")).status).toBe(200);
    expect(queries).toBe(asked + 1);
  });

  test("a prefill worker that answers 503 while the decode worker waits for the KV: the decode leg cut, a 502 naming the prefill's failure, counted once", async () => {
    const cut = decodeCut;
    waitArrived = Promise.withResolvers();
    const before = { prefill: await failures(url, "prefill_status"), decode: await failures(url, "decode_status"), decoder: await failures(url, "decoder_unreachable") };
    const res = await post(url, "/v1/completions", { model: "m", prompt: "prefill 503, decode waits", max_tokens: 2, stream: true }, prefiller);
    expect(res.status).toBe(502);
    expect(((await res.json()) as any).error.message).toBe(`the prefill leg failed (prefill worker ${prefiller} answered 503): the decode leg was cancelled`);
    await waitFor(() => decodeCut === cut + 1, { message: "the decode leg cut" });
    expect(await failures(url, "prefill_status")).toBe(before.prefill + 1);
    expect(await failures(url, "decode_status")).toBe(before.decode);
    expect(await failures(url, "decoder_unreachable")).toBe(before.decoder);
  });

  test("a prefill worker that refuses the connection: the same, counted as prefill_unreachable", async () => {
    const before = await failures(url, "prefill_unreachable");
    // The same host, so the same bootstrap server answers /query; nothing listens on the port.
    const refused = `${C}:${await freePort(C)}`;
    const res = await post(url, "/v1/chat/completions", { model: "m", prompt: "decode waits", messages: [{ role: "user", content: "x" }] }, refused);
    expect(res.status).toBe(502);
    expect(((await res.json()) as any).error.message).toContain(`the prefill leg failed (prefill worker ${refused} unreachable`);
    // Refused at once, the decode leg may be cut before it reaches its worker: none is left waiting.
    await waitFor(() => waiting === 0, { message: "no decode leg left waiting" });
    expect(await failures(url, "prefill_unreachable")).toBe(before + 1);
  });
});
