// Replays trace records in (compressed) real time: each request is routed through an EPP replica's
// ext_proc, then sent to the chosen mock worker, streamed, and its end reported back to the EPP. Bodies
// are built ahead of their arrival (bodies.ts), so a burst's requests all go out at their instant.
import { arrivalTimes, type TraceRecord } from "../trace.ts";
import { RoutingError, type ExtProcClient, type Routed } from "@kv-epp/epp";
import { BodyLookahead } from "./bodies.ts";
import type { DemoStats } from "./stats.ts";

export type Replica = { name: string; client: ExtProcClient };

export type LoadGenOptions = {
  model: string;
  timeScale: number;
  /** replicas currently taking traffic, read at every request (the demo swaps them midway) */
  replicas: () => readonly Replica[];
  /** ip:port of each worker → worker id */
  workerOf: (endpoint: string) => string;
  stats: DemoStats;
  /** called after each request is sent (to trigger the midway event) */
  onSent?: (sent: number) => void;
  signal: AbortSignal;
  /** at the trace's (quantised) timestamps, or spread evenly within each step (default recorded) */
  arrivals?: "recorded" | "spread";
  /** bodies built ahead of their arrival (default 64) */
  lookahead?: number;
};

export async function replay(records: readonly TraceRecord[], o: LoadGenOptions): Promise<void> {
  const at = arrivalTimes(records, o.timeScale, o.arrivals ?? "recorded");
  const running: Promise<void>[] = [];
  // A request that fails unexpectedly (not a routing or worker error, which are counted) stops the
  // replay; it is caught at once so it cannot surface as an unhandled rejection while others run.
  let failure: { error: unknown } | undefined;
  const bodies = new BodyLookahead(records, o.model, o.lookahead);
  // The first bodies before the clock starts; the rest in the gaps between arrivals.
  await bodies.fill(() => !o.signal.aborted);
  const t0 = performance.now();
  for (let i = 0; i < records.length; i++) {
    const due = t0 + at[i]!;
    // Stop building ~2 ms before the instant: one body can take ~10 ms, so a last one may still overrun.
    await bodies.fill(() => performance.now() < due - 2 && !o.signal.aborted);
    const wait = due - performance.now();
    if (wait > 0) await Bun.sleep(wait);
    if (o.signal.aborted || failure) break;
    running.push(oneRequest(bodies.take(i), due, i, o).catch((error: unknown) => void (failure ??= { error })));
    o.stats.sent++;
    o.onSent?.(o.stats.sent);
  }
  await Promise.all(running);
  o.stats.lateBodies = bodies.late;
  if (failure) throw failure.error;
}

/** `due`: the arrival instant (performance.now() time), to measure how late the headers went out. */
async function oneRequest(body: Uint8Array, due: number, turn: number, o: LoadGenOptions): Promise<void> {
  const routed = await routeWithRetry(body, turn, o);
  if (!routed) return o.stats.finished("routing-error");
  const { r, epp } = routed;
  const worker = o.workerOf(r.endpoint);
  o.stats.picked(worker, epp, r.pickMs, r.writtenAt - due);
  let status = 0;
  try {
    const res = await completion(r.endpoint, body, o.signal);
    status = res.status;
    o.stats.finished(res.usage ? "ok" : "worker-error", res.usage);
  } catch {
    o.stats.finished("worker-error");
  } finally {
    o.stats.released(worker);
    // The replica that routed it may have been killed meanwhile: nothing to release there then.
    await r.finish(status || 502).catch(() => {});
  }
}

/** Like a gateway with a retry policy: a replica that fails to answer is skipped for the next one. */
async function routeWithRetry(body: Uint8Array, turn: number, o: LoadGenOptions): Promise<{ r: Routed; epp: string } | undefined> {
  const replicas = o.replicas();
  for (let i = 0; i < replicas.length; i++) {
    const replica = replicas[(turn + i) % replicas.length]!;
    try {
      return { r: await replica.client.route("/v1/completions", body), epp: replica.name };
    } catch (e) {
      if (!(e instanceof RoutingError)) throw e;
      o.stats.routingFailed(`${replica.name}: ${e.message}`);
      if (i + 1 < replicas.length) o.stats.rerouted++;
    }
  }
  return undefined;
}

type Usage = { promptTokens: number; cachedTokens: number; ttftMs: number };

/** POSTs the completion with streaming; TTFT is the first content chunk, tokens from the usage chunk. */
async function completion(endpoint: string, body: Uint8Array, signal: AbortSignal): Promise<{ status: number; usage?: Usage }> {
  const started = performance.now();
  const res = await fetch(`http://${endpoint}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
    signal,
  });
  if (!res.ok || !res.body) return { status: res.status };
  let ttftMs: number | undefined;
  let usage: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens?: number } } | undefined;
  let buf = "";
  const decoder = new TextDecoder();
  for await (const chunk of res.body) {
    buf += decoder.decode(chunk, { stream: true });
    let nl: number;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      if (data === "[DONE]") continue;
      const msg = JSON.parse(data) as { choices?: unknown[]; usage?: typeof usage };
      if (ttftMs === undefined && msg.choices && msg.choices.length > 0) ttftMs = performance.now() - started;
      if (msg.usage) usage = msg.usage;
    }
  }
  if (!usage) return { status: res.status };
  return {
    status: res.status,
    usage: {
      promptTokens: usage.prompt_tokens,
      cachedTokens: usage.prompt_tokens_details?.cached_tokens ?? 0,
      ttftMs: ttftMs ?? performance.now() - started,
    },
  };
}
