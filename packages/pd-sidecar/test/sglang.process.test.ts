import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startMockWorker, type MockWorker } from "@kv-epp/mock-worker";
import { waitFor, type ProcessHandle, LOOPBACK } from "@kv-epp/testkit";
import { expectRefusedPrefillAnswered502, expectStreamedChatPrefilledRemotely, failures, metric, post, startSidecarProcess } from "./process-support.ts";

// `bun run pd-sidecar --kv-connector sglang` as a process in front of a decode-mode SGLang mock worker, a
// prefill-mode one as the prefiller: both legs at once, paired by bootstrap_room, the workers' ground truth
// showing where the prompt was computed; then between two capturing servers, for the exact bodies.

const P = `${LOOPBACK}.2.114`, D = `${LOOPBACK}.2.115`, S = `${LOOPBACK}.2.116`, C = `${LOOPBACK}.2.118`;
const common = { port: 0, speed: 0, blockSize: 16, model: "mock/model", logLevel: "silent" as const, eventEncoding: "sglang-map" as const };
let prefill: MockWorker, decode: MockWorker;
const sidecars: ProcessHandle[] = [];

const startSidecar = (host: string, decoder: string, extra: string[]) => startSidecarProcess(host, decoder, ["--kv-connector", "sglang", ...extra], sidecars);
afterAll(async () => {
  await Promise.all(sidecars.map((s) => s.kill()));
  await Promise.all([prefill?.close(), decode?.close()]);
});

describe("the P/D sidecar with --kv-connector sglang, between SGLang mock workers", () => {
  let url: string;
  beforeAll(async () => {
    prefill = await startMockWorker({ ...common, listen: P, kvEvents: `tcp://${P}:0`, disaggregationMode: "prefill", disaggregationBootstrapPort: 0 });
    decode = await startMockWorker({ ...common, listen: D, kvEvents: `tcp://${D}:0`, disaggregationMode: "decode" });
    url = await startSidecar(S, decode.url, ["--sglang-bootstrap-port", String(prefill.bootstrapPort)]);
  });

  test("a streamed chat: the prefill worker computes the prompt, the decode worker takes its blocks by room and answers", async () => {
    await expectStreamedChatPrefilledRemotely(url, prefill, decode, "how do a prefill and a decode server meet? ".repeat(8));
    // The prefill leg ends once its room was taken.
    expect(await metric(`${prefill.url}/metrics`, `mock_worker_sglang_held_rooms{model_name="mock/model"}`)).toBe(0);
  });

  test("a completion too, JSON", async () => {
    const res = await post(url, "/v1/completions", { model: "mock/model", prompt: Array.from({ length: 40 }, (_, i) => 900 + i), max_tokens: 3 }, new URL(prefill.url).host);
    expect(res.status).toBe(200);
    const body = (await res.json()) as any;
    expect(body.usage).toMatchObject({ prompt_tokens: 40, completion_tokens: 3, prompt_tokens_details: { cached_tokens: 39 } });
  });

  test("a prefill worker that is down while the decode worker waits for its room: the decode leg cut, a 502 naming the prefill's failure, counted once", async () => {
    // The prefill worker's host: its bootstrap server is up, so the decode worker waits for the room (up to
    // SGLANG_DISAGGREGATION_WAITING_TIMEOUT, 300 s) unless the sidecar cuts it.
    await expectRefusedPrefillAnswered502(url, P);
  });
});

describe("the P/D sidecar with --kv-connector sglang, between capturing servers", () => {
  type Seen = { text: string; headers: Headers };
  const seen: { prefill: Seen[]; decode: Seen[] } = { prefill: [], decode: [] };
  let hold: Promise<void> | null = null;
  /** set when the decode leg of a streamed request was cut (the client went away mid-stream) */
  let decodeCut = false;
  let servers: ReturnType<typeof Bun.serve>[] = [];
  let url: string, prefiller: string;
  beforeAll(async () => {
    const answer = { id: "x", object: "chat.completion", choices: [{ index: 0, message: { role: "assistant", content: "hi" }, finish_reason: "length" }] };
    const pserver = Bun.serve({
      hostname: C, port: 0, idleTimeout: 0,
      fetch: async (req) => {
        seen.prefill.push({ text: await req.text(), headers: req.headers });
        if (hold) await hold; // the test says when the prefill answers
        return Response.json(answer);
      },
    });
    const dserver = Bun.serve({
      hostname: C, port: 0, idleTimeout: 0,
      fetch: async (req) => {
        const text = await req.text();
        seen.decode.push({ text, headers: req.headers });
        if (!text.includes('"stream":true')) return Response.json(answer);
        // A stream that sends its first chunk and never ends, until the sidecar cuts it.
        req.signal.addEventListener("abort", () => (decodeCut = true));
        return new Response(new ReadableStream({ start: (ctl) => ctl.enqueue(new TextEncoder().encode("data: {}\n\n")) }), { headers: { "content-type": "text/event-stream" } });
      },
    });
    servers = [pserver, dserver];
    prefiller = `${C}:${pserver.port}`;
    url = await startSidecar(`${LOOPBACK}.2.119`, `http://${C}:${dserver.port}`, ["--sglang-bootstrap-port", "9123", "--prefill-timeout-ms", "1500"]);
  });
  afterAll(() => {
    for (const s of servers) void s.stop(true);
  });

  test("both legs carry the client's body with the same exact room, the prefiller's host and the bootstrap port", async () => {
    const client = { model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 7, stream: false, bootstrap_room: 1 };
    for (let i = 0; i < 3; i++) expect((await post(url, "/v1/chat/completions", client, prefiller)).status).toBe(200);
    await waitFor(() => seen.prefill.length === 3, { message: "three prefill legs" });
    const rooms: bigint[] = [];
    for (let i = 0; i < 3; i++) {
      const [p, d] = [seen.prefill[i]!, seen.decode[i]!];
      // The room is written as digits: a JSON reader that keeps integers exact (Python's) reads the same value.
      const room = /"bootstrap_room":(\d+)\}$/.exec(p.text)?.[1];
      expect(room).toBeDefined();
      expect(d.text).toBe(p.text);
      rooms.push(BigInt(room!));
      const { bootstrap_room: _, ...body } = JSON.parse(p.text);
      expect(body).toEqual({ ...client, bootstrap_room: undefined, bootstrap_host: C, bootstrap_port: 9123 });
      expect(p.headers.get("x-prefiller-host-port")).toBeNull();
      expect(p.headers.get("x-request-id")).toBe(d.headers.get("x-request-id"));
    }
    for (const r of rooms) expect(r < 2n ** 63n).toBe(true);
    expect(new Set(rooms).size).toBe(3);
    // Three draws from [0, 2^63) all at or below 2^53 would be a 2^-30 chance: some room must be past a double's precision.
    expect(rooms.some((r) => r > 2n ** 53n)).toBe(true);
    // Nor were they written through a double: such digits would be a double's own shortest form, which a random room
    // past 2^53 almost never is.
    expect(rooms.some((r) => r > 2n ** 53n && String(Number(r)) !== r.toString())).toBe(true);
  });

  test("the prefill leg is not cancelled when the client goes away first, but is bounded by --prefill-timeout-ms", async () => {
    let release!: () => void;
    hold = new Promise<void>((r) => (release = r));
    const answered = await metric(`${url}/sidecar/metrics`, "pd_sidecar_prefill_duration_seconds_count");
    // The client reads the decode's first chunk and hangs up while the prefill leg still runs.
    const ctl = new AbortController();
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: "POST", signal: ctl.signal,
      headers: { "content-type": "application/json", "x-prefiller-host-port": prefiller },
      body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "later" }], stream: true }),
    });
    expect(res.status).toBe(200);
    await res.body!.getReader().read();
    ctl.abort();
    await waitFor(() => decodeCut, { message: "the decode leg cut with the client" });
    release();
    await waitFor(async () => (await metric(`${url}/sidecar/metrics`, "pd_sidecar_prefill_duration_seconds_count")) === answered + 1, { message: "the prefill leg answered after the client had its answer" });
    const timeouts = await failures(url, "prefill_timeout");
    hold = new Promise<void>(() => {}); // never answers
    expect((await post(url, "/v1/chat/completions", { model: "m", messages: [{ role: "user", content: "never" }] }, prefiller)).status).toBe(200);
    await waitFor(async () => (await failures(url, "prefill_timeout")) === timeouts + 1, { message: "the prefill leg timed out" });
    hold = null;
  });
});
