import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import { freePort, LOOPBACK, spawnBun, waitFor, type ProcessHandle } from "@kv-epp/testkit";
import pino from "pino";
import { parseConfig, startSidecar, type Sidecar, type SidecarOptions } from "../src/index.ts";

// The prefill leg sent again on 502/503/504 or no answer (within --prefill-timeout-ms, never after the
// client left), and a prefill worker drawn among the header's candidates, each of them allowed: a real
// sidecar (in this process, or `bun run pd-sidecar` where its flags are the point) between servers on
// loopback that answer as scripted and keep what they were sent. Addresses 127.S.2.81-86.

const ROOT = `${import.meta.dir}/../../..`;
const DECODE_HOST = `${LOOPBACK}.2.81`;
const SIDECAR_HOST = `${LOOPBACK}.2.82`;
const KV = { do_remote_prefill: true, do_remote_decode: false, remote_block_ids: [[5]], remote_engine_id: "e", remote_request_id: "r", remote_host: "h", remote_port: 1 };
const completion = (cached: number) => ({ id: "cmpl", choices: [{ index: 0, text: " ok" }], usage: { prompt_tokens: 20, completion_tokens: 1, prompt_tokens_details: { cached_tokens: cached } } });

type Seen = { headers: Headers; body: any };
type Fake = { seen: Seen[]; target: string; stop(): Promise<void> };

/** A prefill worker on `host` answering its n-th request (from 1) with `script(n)`. */
function fakePrefill(host: string, script: (n: number) => Response | Promise<Response>): Fake {
  const seen: Seen[] = [];
  const server = Bun.serve({ hostname: host, port: 0, fetch: async (req) => {
    seen.push({ headers: req.headers, body: await req.json() });
    return script(seen.length);
  } });
  return { seen, target: `${host}:${server.port}`, stop: async () => void (await server.stop(true)) };
}
const ok = () => Response.json({ ...completion(16), kv_transfer_params: KV });
const status = (code: number, n: number) => Response.json({ error: { message: `busy ${n}`, code } }, { status: code });

let decode: Fake;
const cleanup: (() => Promise<unknown>)[] = [];
beforeAll(() => {
  decode = fakePrefill(DECODE_HOST, () => Response.json(completion(19)));
});
afterEach(async () => {
  await Promise.all(cleanup.splice(0).map((f) => f()));
});
afterAll(async () => {
  await decode?.stop();
});

async function sidecar(opts: SidecarOptions): Promise<Sidecar> {
  const s = await startSidecar({ listen: SIDECAR_HOST, port: await freePort(SIDECAR_HOST), decoder: `http://${decode.target}`, logger: pino({ level: "silent" }), ...opts });
  cleanup.push(() => s.close());
  return s;
}
function prefill(host: string, script: (n: number) => Response | Promise<Response>): Fake {
  const f = fakePrefill(host, script);
  cleanup.push(() => f.stop());
  return f;
}
const post = (base: string, prefiller: string, init: RequestInit = {}) =>
  fetch(`${base}/v1/completions`, { method: "POST", headers: { "content-type": "application/json", "x-prefiller-host-port": prefiller }, body: JSON.stringify({ model: "m", prompt: "hello", max_tokens: 3 }), ...init });
async function metric(base: string, line: string): Promise<number> {
  const text = await (await fetch(`${base}/sidecar/metrics`)).text();
  const found = text.split("\n").find((l) => l.startsWith(line + " "));
  return found === undefined ? 0 : Number(found.slice(line.length + 1));
}
const retries = (reason: string) => `pd_sidecar_prefill_retries_total{reason="${reason}"}`;
const failures = (reason: string) => `pd_sidecar_failures_total{reason="${reason}"}`;

function spawnSidecar(port: number, flags: string[], env: Record<string, string> = {}): ProcessHandle {
  const proc = spawnBun([`${ROOT}/packages/pd-sidecar/src/main.ts`, "--listen", SIDECAR_HOST, "--port", String(port), "--decoder", `http://${decode.target}`, ...flags], { PD_SIDECAR_LOG_LEVEL: "warn", ...env }, { name: "pd-sidecar retry" });
  cleanup.push(() => proc.kill());
  return proc;
}
const up = (base: string) => waitFor(() => fetch(`${base}/sidecar/metrics`).then((r) => r.ok, () => false), { message: `${base}/sidecar/metrics` });

describe("the prefill leg is sent again when the prefill worker cannot take it", () => {
  test("a prefill worker answering 503, then 200, is retried (same body, same request id) and the request succeeds", async () => {
    const p = prefill(`${LOOPBACK}.2.83`, (n) => (n === 1 ? status(503, n) : ok()));
    const port = await freePort(SIDECAR_HOST);
    spawnSidecar(port, ["--prefill-max-retries", "2", "--prefill-retry-backoff-ms", "1"]);
    const base = `http://${SIDECAR_HOST}:${port}`;
    await up(base);
    decode.seen.length = 0;
    const res = await post(base, p.target);
    expect(res.status).toBe(200);
    expect(((await res.json()) as any).usage.prompt_tokens_details).toEqual({ cached_tokens: 16 });
    expect(p.seen).toHaveLength(2);
    expect(p.seen[1]!.body).toEqual(p.seen[0]!.body);
    expect(p.seen[1]!.headers.get("x-request-id")).toBe(p.seen[0]!.headers.get("x-request-id"));
    expect(decode.seen.map((s) => s.body.kv_transfer_params)).toEqual([KV]);
    expect(await metric(base, retries("status_503"))).toBe(1);
    expect(await metric(base, failures("prefill_status"))).toBe(0);
  });

  test("retries run out: the last error is the client's; a status not retried ends at once; no answer is retried too", async () => {
    const s = await sidecar({ prefillMaxRetries: 2, prefillRetryBackoffMs: 1 });
    const codes = [502, 503, 504];
    const p = prefill(`${LOOPBACK}.2.83`, (n) => status(codes[n - 1] ?? 500, n));
    const res = await post(s.url, p.target);
    expect(res.status).toBe(504);
    expect(((await res.json()) as any).error.message).toBe("busy 3");
    expect(p.seen).toHaveLength(3);
    expect(await metric(s.url, retries("status_502"))).toBe(1);
    expect(await metric(s.url, retries("status_503"))).toBe(1);
    expect(await metric(s.url, retries("status_504"))).toBe(0);
    expect(await metric(s.url, failures("prefill_status"))).toBe(1);

    // 500 (a bug, not a passing overload) is answered as it is, at once, as llm-d's sidecar does.
    const broken = prefill(`${LOOPBACK}.2.84`, (n) => status(500, n));
    expect((await post(s.url, broken.target)).status).toBe(500);
    expect(broken.seen).toHaveLength(1);

    // Nobody listening: tried three times, then the 502 the sidecar writes.
    const dead = `${LOOPBACK}.2.85:${await freePort(`${LOOPBACK}.2.85`)}`;
    expect((await post(s.url, dead)).status).toBe(502);
    expect(await metric(s.url, retries("unreachable"))).toBe(2);
    expect(await metric(s.url, failures("prefill_unreachable"))).toBe(1);
  });

  test("the retries stop at --prefill-timeout-ms: the last error comes back before they run out", async () => {
    const s = await sidecar({ prefillMaxRetries: 1_000_000, prefillRetryBackoffMs: 20, prefillTimeoutMs: 300 });
    const p = prefill(`${LOOPBACK}.2.83`, (n) => status(503, n));
    const res = await post(s.url, p.target);
    expect(res.status).toBe(503);
    const sent = p.seen.length;
    expect(sent).toBeGreaterThan(1);
    expect(sent).toBeLessThan(1_000);
    expect(await metric(s.url, retries("status_503"))).toBe(sent - 1);
  });

  test("a client that goes away stops the retries: nothing is sent after it left, the pause ends with it", async () => {
    // A pause far longer than the test waits: only a pause that ends when the client leaves lets the request end.
    const s = await sidecar({ prefillMaxRetries: 1_000, prefillRetryBackoffMs: 600_000, prefillTimeoutMs: 1_200_000 });
    const p = prefill(`${LOOPBACK}.2.83`, (n) => status(503, n));
    const client = new AbortController();
    const pending = post(s.url, p.target, { signal: client.signal }).catch((e: Error) => e.name);
    await waitFor(() => p.seen.length === 1, { message: "the first prefill attempt" });
    client.abort();
    expect(await pending).toBe("AbortError");
    await waitFor(async () => (await metric(s.url, failures("client_closed"))) === 1, { message: "the request ended for its client's leaving" });
    expect(p.seen).toHaveLength(1);
    expect(await metric(s.url, retries("status_503"))).toBe(0);
  });
});

describe("a prefill worker drawn among the header's candidates", () => {
  test("with sampling (PD_SIDECAR_PREFILLER_SAMPLING) every allowed candidate is drawn; a list naming one not allowed is refused whole", async () => {
    const a = prefill(`${LOOPBACK}.2.83`, ok);
    const b = prefill(`${LOOPBACK}.2.84`, ok);
    const c = prefill(`${LOOPBACK}.2.86`, ok);
    const port = await freePort(SIDECAR_HOST);
    spawnSidecar(port, ["--allowed-prefillers", `${a.target},${b.target}`], { PD_SIDECAR_PREFILLER_SAMPLING: "true" });
    const base = `http://${SIDECAR_HOST}:${port}`;
    await up(base);
    for (let i = 0; i < 64; i++) expect((await post(base, `${a.target}, ${b.target}`)).status).toBe(200);
    // Uniform draws: 64 of them all on one of two candidates is a 2^-63 chance.
    expect(a.seen.length).toBeGreaterThan(0);
    expect(b.seen.length).toBeGreaterThan(0);
    expect(a.seen.length + b.seen.length).toBe(64);
    // c is not allowed: wherever it stands in the list, the request is refused before any leg is sent.
    const before = a.seen.length + b.seen.length;
    for (const list of [`${a.target},${c.target}`, `${c.target},${b.target}`]) expect((await post(base, list)).status).toBe(403);
    expect(c.seen).toHaveLength(0);
    expect(a.seen.length + b.seen.length).toBe(before);
    expect(await metric(base, failures("forbidden"))).toBe(2);
  });

  test("without sampling the first candidate is taken, and every other one must still be allowed", async () => {
    const a = prefill(`${LOOPBACK}.2.83`, ok);
    const b = prefill(`${LOOPBACK}.2.84`, ok);
    const s = await sidecar({ allowedPrefillers: [a.target, b.target] });
    for (let i = 0; i < 4; i++) expect((await post(s.url, `${a.target},${b.target}`)).status).toBe(200);
    expect([a.seen.length, b.seen.length]).toEqual([4, 0]);
    expect((await post(s.url, `${a.target},${LOOPBACK}.2.86:8000`)).status).toBe(403);
    expect((await post(s.url, `${a.target},not-a-target`)).status).toBe(400);
    expect(a.seen).toHaveLength(4);
  });
});

test("the retry and sampling flags read their variables, and a bad value names the flag", () => {
  expect(parseConfig(["--prefill-max-retries", "3", "--prefill-retry-backoff-ms", "50", "--prefiller-sampling"])).toMatchObject({ prefillMaxRetries: 3, prefillRetryBackoffMs: 50, prefillerSampling: true });
  expect(parseConfig([], { PD_SIDECAR_PREFILL_MAX_RETRIES: "2", PD_SIDECAR_PREFILLER_SAMPLING: "false" })).toMatchObject({ prefillMaxRetries: 2, prefillRetryBackoffMs: 200, prefillerSampling: false });
  expect(() => parseConfig(["--prefill-max-retries", "-1"])).toThrow('invalid value for --prefill-max-retries: "-1"');
  expect(() => parseConfig(["--prefill-retry-backoff-ms", "0"])).toThrow('invalid value for --prefill-retry-backoff-ms: "0"');
  expect(() => parseConfig([], { PD_SIDECAR_PREFILLER_SAMPLING: "maybe" })).toThrow("PD_SIDECAR_PREFILLER_SAMPLING");
});
