// Replays trace records in (compressed) real time as an OpenAI client would: each request goes to the
// gateway (its own process, gateway.ts), which routes it through an EPP replica's ext_proc to a mock
// worker and streams the answer back; this side parses the stream (TTFT, usage). Bodies are built ahead
// of their arrival (bodies.ts), so a burst's requests all go out at their instant.
import { arrivalTimes, type TraceRecord } from "../trace.ts";
import { BodyLookahead, requestSource, type PromptKind, type RequestBody } from "./bodies.ts";
import type { ReceivedReply } from "./chat.ts";
import { GATEWAY_HEADERS } from "./gateway.ts";
import type { DemoStats } from "./stats.ts";

export type LoadGenOptions = {
  model: string;
  timeScale: number;
  /** the gateway's base URL */
  gateway: string;
  /** chat messages (default) or token ids */
  prompt?: PromptKind;
  /** ip:port of each worker → worker id */
  workerOf: (endpoint: string) => string;
  stats: DemoStats;
  /** called after each request is sent (to trigger the midway event) */
  onSent?: (sent: number) => void;
  signal: AbortSignal;
  /** at the trace's (quantised) timestamps, or spread evenly within each step */
  arrivals: "recorded" | "spread";
  /** bodies built ahead of their arrival (default 64) */
  lookahead?: number;
};

export async function replay(records: readonly TraceRecord[], o: LoadGenOptions): Promise<void> {
  const at = arrivalTimes(records, o.timeScale, o.arrivals);
  const running: Promise<void>[] = [];
  // A request that fails unexpectedly (not a routing or worker error, which are counted) stops the
  // replay; it is caught at once so it cannot surface as an unhandled rejection while others run.
  let failure: { error: unknown } | undefined;
  // A chat's next turn resends the reply its client received, as chat clients do (then an EPP that saw the
  // response has warmed it); a body built before that reply came is built again at its instant.
  const source = requestSource(records, o.model, o.prompt ?? "chat");
  const bodies = new BodyLookahead(records.length, source.build, o.lookahead, source.stale);
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
    running.push(oneRequest(bodies.take(i), due, o, (reply) => source.replied(i, reply)).catch((error: unknown) => void (failure ??= { error })));
    o.stats.sent++;
    o.onSent?.(o.stats.sent);
  }
  await Promise.all(running);
  o.stats.lateBodies = bodies.late;
  o.stats.replies = { ...source.replyCounts(), rebuilt: bodies.rebuilt };
  if (failure) throw failure.error;
}

/** `due`: the arrival instant (performance.now() time), to measure how late the gateway asked the EPP. */
async function oneRequest(req: RequestBody, due: number, o: LoadGenOptions, replied: (reply: ReceivedReply) => void): Promise<void> {
  const started = performance.now();
  // A gateway that cannot be reached is not an outcome to count: it stops the replay (fetch throws).
  const res = await fetch(`${o.gateway}${req.path}`, { method: "POST", headers: { "content-type": "application/json" }, body: req.body, signal: o.signal });
  const h = (name: string) => res.headers.get(name);
  const failures = JSON.parse(decodeURIComponent(h(GATEWAY_HEADERS.failures) ?? "%5B%5D")) as string[];
  for (const f of failures) o.stats.routingFailed(f);
  const epp = h(GATEWAY_HEADERS.epp);
  const endpoint = h(GATEWAY_HEADERS.endpoint);
  // Every failed attempt but the last one of a request nobody routed was retried on another replica.
  o.stats.rerouted += epp ? failures.length : Math.max(0, failures.length - 1);
  if (!epp || !endpoint) {
    await res.body?.cancel();
    return o.stats.finished("routing-error");
  }
  const worker = o.workerOf(endpoint);
  const dueAbs = performance.timeOrigin + due;
  o.stats.picked(worker, epp, Number(h(GATEWAY_HEADERS.pickMs)), Number(h(GATEWAY_HEADERS.writtenAt)) - dueAbs);
  try {
    const usage = res.ok ? await readStream(res, started) : undefined;
    if (usage) replied(usage.reply);
    o.stats.finished(usage ? "ok" : "worker-error", usage && { ...usage, epp, worker });
    if (usage) o.stats.lastServed = { body: req.body, worker };
  } catch {
    o.stats.finished("worker-error");
  } finally {
    o.stats.released(worker);
  }
}

/**
 * `detailed`: the usage had prompt_tokens_details (vLLM writes null there when nothing was cached). `reply`:
 * the streamed text (a chat's deltas' content, a completion's text) and the role a chat's first delta named.
 */
type Usage = { promptTokens: number; cachedTokens: number; detailed: boolean; ttftMs: number; reply: ReceivedReply };

/** Reads a streamed answer: TTFT at the first content chunk (from the request's start), tokens from the usage chunk, the reply. */
export async function readStream(res: Response, started: number): Promise<Usage | undefined> {
  if (!res.body) return undefined;
  let ttftMs: number | undefined;
  let usage: { prompt_tokens: number; prompt_tokens_details?: { cached_tokens?: number } } | undefined;
  let buf = "";
  let reply = "";
  let role: string | undefined;
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
      const msg = JSON.parse(data) as { choices?: { delta?: { role?: string; content?: string | null }; text?: string }[]; usage?: typeof usage };
      if (ttftMs === undefined && msg.choices && msg.choices.length > 0) ttftMs = performance.now() - started;
      const choice = msg.choices?.[0];
      reply += choice?.delta?.content ?? choice?.text ?? "";
      // The first delta names it (as OpenAI and vLLM stream a chat); a client resends the reply in it.
      role ??= choice?.delta?.role;
      if (msg.usage) usage = msg.usage;
    }
  }
  if (!usage) return undefined;
  return {
    promptTokens: usage.prompt_tokens,
    cachedTokens: usage.prompt_tokens_details?.cached_tokens ?? 0,
    detailed: usage.prompt_tokens_details?.cached_tokens !== undefined,
    ttftMs: ttftMs ?? performance.now() - started,
    reply: { content: reply, role },
  };
}
