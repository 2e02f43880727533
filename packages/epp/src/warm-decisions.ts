// Warming the decision thread before the replica serves. A thread's first picks run through code the JIT has not
// compiled yet (TLS and HTTP/2 framing, the protobuf codec, the stream's state machine, the pool's handoff, the
// picker, the wasm index): measured with bursts of 12 of the trace's chats, the first burst after start took 27-43 ms
// a pick inside the EPP, the later ones 5-19 ms. A replica added by a rollout or a scale-up answers its first
// traffic that late unless its code is warm, and pool members warming their tokenizer (warm-up.ts) leave the
// decision thread cold. So before its servers start, the EPP runs invented chats through its own decision path:
// an ext_proc server on loopback built by the same function and served with the same certificate and body mode,
// its real body reader (the tokenizer pool, so members warm their body path too), and a scratch index (empty: the
// block hashing and lookups run, on no blocks), load and metrics, so nothing of the warm-up is routed or kept; the
// pool then forgets it (caches, counters, placements).
import { EvictionRegret, ActiveLoad, latencyModel, pendingPrefixes, Picker, RoutingQuality, type Candidate, type RoutingContext } from "@kv-epp/routing";
import { workerKey } from "@kv-epp/protocol";
import { mixedText, seeded } from "@kv-epp/tokenizer";
import pino from "pino";
import type { EppConfig } from "./config.ts";
import { BodyBudget } from "./extproc/body-budget.ts";
import { ExtProcClient } from "./extproc/client.ts";
import type { Certificate } from "./extproc/tls.ts";
import { HealthState } from "./health.ts";
import { Indexers } from "./indexers/indexers.ts";
import { createMetrics, routingMetrics } from "./metrics.ts";
import { startExtProc } from "./servers.ts";
import type { TokenizeBody } from "./tokens.ts";

export type DecisionWarmUp = {
  picks: number;
  ms: number;
  /** The first pick's latency and the median of the last ten, at the warm-up's client (ms). */
  firstPickMs: number;
  lastPicksMs: number;
};

/** Exchanges in flight at once: a burst's worth, so held messages and the pool's queues run too. */
const LANES = 4;
/** The warm-up ends at its count of picks or after this long, whichever comes first (an exchange then in flight fails). */
const DEFAULT_MAX_MS = 5000;
/** Ranks of the scratch index: enough for the picker to weigh several. */
const RANKS = 4;

export type WarmDecisionsOptions = {
  cfg: Pick<EppConfig, "model" | "picker" | "bodyMode" | "tls" | "routeOnSettledPrefix" | "fallbackEndpoints" | "responseRole">;
  certificate: Certificate | undefined;
  /** The replica's body reader, counting nothing (no `onRead`). */
  tokenizeBody: TokenizeBody;
  /** Forgets what the warm-up left cached (the pool's or the preprocessor's segment cache, its counters too). */
  forget: () => Promise<void> | void;
  picks: number;
  /** Default DEFAULT_MAX_MS. */
  maxMs?: number;
};

/** Runs `picks` invented exchanges through the decision path (see the top of this file); resolves when it is torn down. */
export async function warmDecisions(o: WarmDecisionsOptions): Promise<DecisionWarmUp> {
  const t0 = performance.now();
  const silent = pino({ level: "silent" });
  const metrics = createMetrics(undefined, { process: false });
  const indexers = new Indexers(metrics, silent, { regret: new EvictionRegret() });
  indexers.models.register(o.cfg.model.name, o.cfg.model.tenant, o.cfg.model.blockSize);
  const ranks: Candidate[] = Array.from({ length: RANKS }, (_, r) => {
    const ref = { workerId: "warm-up", dpRank: r };
    return { ...ref, key: workerKey(ref), endpoint: `127.0.0.1:${8000 + r}`, rankHeader: r };
  });
  const pending = pendingPrefixes(o.cfg.picker);
  const load = new ActiveLoad(pending);
  const latency = latencyModel(o.cfg.picker, new EvictionRegret());
  const picker = new Picker({ indexers: indexers.models, candidates: () => ranks, load, signals: () => undefined, options: o.cfg.picker, latency, pending });
  const figures = routingMetrics(metrics);
  const routing: RoutingContext = {
    picker, load, latency, quality: new RoutingQuality(figures), metrics: figures, clock: { now: () => performance.now() }, candidates: () => ranks,
  };
  const server = await startExtProc(
    { listen: "127.0.0.1", ports: { grpc: 0 } as EppConfig["ports"], tls: o.cfg.tls.mode === "off" ? o.cfg.tls : { mode: "self-signed" }, healthOnExtProc: false },
    {
      handler: {
        routing, tokenizeBody: o.tokenizeBody, routeOnSettledPrefix: o.cfg.routeOnSettledPrefix, metrics, log: silent, bodyMode: o.cfg.bodyMode,
        maxInflight: 0, bodyBudget: new BodyBudget(256 << 20), fallbacks: o.cfg.fallbackEndpoints,
      },
      certificate: o.certificate, health: new HealthState(), metrics, log: silent,
    },
  );
  const latencies: number[] = [];
  let client: ExtProcClient | undefined;
  // Past the bound, whatever is in flight fails: the server goes, and with it every stream.
  let timer: ReturnType<typeof setTimeout> | undefined;
  const deadline = new Promise<void>((resolve) => (timer = setTimeout(resolve, Math.max(0, (o.maxMs ?? DEFAULT_MAX_MS) - (performance.now() - t0)))));
  try {
    const c = (client = new ExtProcClient(`127.0.0.1:${server.port}`, o.cfg.bodyMode === "buffered" || o.cfg.bodyMode === "buffered-partial" ? "buffered" : "full-duplex", { tls: o.cfg.tls.mode !== "off" }));
    const bodies = inventedBodies(o.cfg.model.name, o.cfg.responseRole);
    let next = 0;
    let over = false;
    const lane = async () => {
      while (next < o.picks && !over) {
        const i = next++;
        const { path, body, reply } = bodies(i);
        const routed = await c.route(path, body);
        latencies[i] = routed.pickMs;
        await routed.finish(200, reply);
      }
    };
    const lanes = Promise.all(Array.from({ length: Math.min(LANES, o.picks) }, lane));
    await Promise.race([lanes, deadline.then(() => void (over = true))]);
    if (over) lanes.catch(() => {}); // its streams fail as the server goes
  } finally {
    clearTimeout(timer);
    client?.close();
    await server.shutdown(0);
    server.stop();
    await o.forget();
  }
  const done = latencies.filter((x) => x !== undefined);
  const last = done.slice(-10).sort((a, b) => a - b);
  return { picks: done.length, ms: performance.now() - t0, firstPickMs: latencies[0] ?? 0, lastPicksMs: last[Math.floor(last.length / 2)] ?? 0 };
}

const enc = new TextEncoder();

/**
 * The warm-up's requests: conversations growing turn by turn (each resending the earlier turns, as chats do), now and
 * then a completion of token ids (which the decision thread reads itself), each answered with a streamed reply in the
 * workers' response role.
 */
function inventedBodies(model: string, role: string): (i: number) => { path: string; body: Uint8Array; reply: Uint8Array } {
  const rand = seeded(0x5eed);
  const conversations = Array.from({ length: LANES * 2 }, () => [{ role: "system", content: mixedText(rand, 200) }]);
  const reply = (text: string) => enc.encode(
    `data: ${JSON.stringify({ choices: [{ index: 0, delta: { role, content: text } }] })}\n\n` +
    `data: ${JSON.stringify({ choices: [{ index: 0, delta: {}, finish_reason: "stop" }], usage: { prompt_tokens: 1, completion_tokens: 1, prompt_tokens_details: { cached_tokens: 0 } } })}\n\ndata: [DONE]\n\n`,
  );
  return (i) => {
    if (i % 5 === 4) {
      const prompt = Array.from({ length: 256 + Math.floor(rand() * 2048) }, () => Math.floor(rand() * 100_000));
      return { path: "/v1/completions", body: enc.encode(JSON.stringify({ model, prompt, max_tokens: 1 })), reply: reply("ok") };
    }
    const messages = conversations[i % conversations.length]!;
    if (messages.length > 12) messages.splice(1);
    messages.push({ role: "user", content: mixedText(rand, 100 + Math.floor(rand() * 600)) });
    const body = enc.encode(JSON.stringify({ model, messages, max_tokens: 16, stream: true, stream_options: { include_usage: true } }));
    const answer = mixedText(rand, 40);
    messages.push({ role, content: answer });
    return { path: "/v1/chat/completions", body, reply: reply(answer) };
  };
}
