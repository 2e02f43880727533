import { Hono, type Context } from "hono";
import pino, { type Logger } from "pino";
import { randomUUID } from "node:crypto";
import { hostPort, PREFILL_RANK_HEADER, splitPath, type PdSplitPath } from "@kv-epp/protocol";
import { isObject, SPLIT_APIS } from "./apis.ts";
import { resolveConfig, type SidecarConfig } from "./config.ts";
import { createMetrics, type SidecarMetrics } from "./metrics.ts";
import { decodeBody, prefillBody, prefillOutcome, type Body } from "./prefill-request.ts";
import { sendPrefill } from "./prefill-leg.ts";
import { PREFILLER_HEADER, isHostPort, pickPrefiller, prefillerCandidates } from "./prefiller-header.ts";
import { BootstrapError, EngineMapCache, mooncakeLegs } from "./mooncake.ts";
import { PrefillLegFailed } from "./concurrent-legs.ts";
import { sglangLegs } from "./sglang.ts";
import { rewriteJson, rewriteSse } from "./usage-rewrite.ts";

/**
 * The P/D sidecar in front of a decode worker, as llm-d's pd-sidecar: the gateway sends it the
 * requests an EPP routed to this decode worker. With `x-prefiller-host-port` (the prefill worker the
 * EPP chose) a request on a split path (@kv-epp/protocol's splitPath, the rule the EPP names a prefill
 * worker by: completions, chat, Responses, Messages, generate) runs in two legs, each to the path and
 * query the client sent: the prefill leg to that worker, which computes the prompt and answers with
 * `kv_transfer_params`, then the decode leg to the local worker with them, whose answer (streamed or
 * not) goes back to the client. Without it, or on any other route, the request passes through to the
 * local worker unchanged. With `--kv-connector sglang` both legs go at once instead, paired by an SGLang
 * bootstrap room (sglang.ts); with `--kv-connector mooncake` too, paired by a transfer id once the prefill
 * worker's engine id is known (mooncake.ts).
 */

const REQUEST_ID = "x-request-id";
// Connection-scoped or recomputed per hop: never copied from one leg to the next.
const HOP_HEADERS = ["host", "connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "te", "trailer", "proxy-connection", "content-encoding"];

export type SidecarOptions = Partial<Parameters<typeof resolveConfig>[0]> & { logger?: Logger };

export type Sidecar = { url: string; config: SidecarConfig; close(): Promise<void> };

/** vLLM's rank header: a server fronting several DP ranks runs the request on the one it names. */
const DP_RANK_HEADER = "x-data-parallel-rank";

function forwardHeaders(from: Headers): Headers {
  const h = new Headers(from);
  for (const name of HOP_HEADERS) h.delete(name);
  h.delete(PREFILLER_HEADER);
  h.delete(PREFILL_RANK_HEADER);
  return h;
}

function errorBody(c: Context, status: 400 | 403 | 502, message: string) {
  return c.json({ error: { message, type: status === 400 ? "BadRequestError" : status === 403 ? "Forbidden" : "BadGateway", param: null, code: status } }, status);
}

function answer(res: Response, body: ReadableStream<Uint8Array> | string | null): Response {
  const headers = forwardHeaders(res.headers);
  return new Response(body, { status: res.status, headers });
}

function sidecarApp(config: SidecarConfig, log: Logger, metrics: SidecarMetrics, closing: AbortSignal): Hono {
  const decoder = config.decoder.replace(/\/$/, "");
  const allowed = new Set(config.allowedPrefillers);
  const engines = new EngineMapCache();
  const app = new Hono();

  const passThrough = async (c: Context) => {
    const req = c.req.raw;
    const url = new URL(req.url);
    try {
      const res = await fetch(`${decoder}${url.pathname}${url.search}`, {
        method: req.method, headers: forwardHeaders(req.headers),
        body: req.method === "GET" || req.method === "HEAD" ? undefined : await req.arrayBuffer(),
        signal: req.signal, redirect: "manual",
      });
      return answer(res, res.body);
    } catch (err) {
      if (req.signal.aborted) return c.body(null, 499 as never);
      // Probes before the worker is up land here too: not a failed P/D request.
      metrics.failed("passthrough_unreachable");
      log.debug({ err, path: url.pathname }, "decode worker unreachable");
      return errorBody(c, 502, `decode worker unreachable: ${(err as Error).message}`);
    }
  };

  /** `api`: the split API the request's path names; `target`: that path with its query, as the client sent it. */
  const disaggregated = async (c: Context, api: PdSplitPath, target: string) => {
    const candidates = prefillerCandidates(c.req.header(PREFILLER_HEADER));
    if (candidates.length === 0) {
      metrics.request("local");
      return passThrough(c);
    }
    // Every candidate is checked, not only the one taken: the answer does not depend on the draw, and a
    // header naming a target it may not name is refused whole.
    const malformed = candidates.find((t) => !isHostPort(t));
    if (malformed !== undefined) {
      metrics.failed("bad_header");
      return errorBody(c, 400, `${PREFILLER_HEADER} must be host:port, got ${JSON.stringify(malformed)}`);
    }
    const refused = allowed.size > 0 ? candidates.find((t) => !allowed.has(t)) : undefined;
    if (refused !== undefined) {
      metrics.failed("forbidden");
      log.warn({ peer: refused }, "prefill target not in --allowed-prefillers");
      return errorBody(c, 403, `prefill target ${refused} is not allowed`);
    }
    const prefiller = pickPrefiller(candidates, config.prefillerSampling)!;
    let client: Body;
    try {
      const parsed: unknown = await c.req.json();
      if (!isObject(parsed)) throw new Error("expected a JSON object");
      client = parsed;
    } catch (e) {
      metrics.failed("bad_body");
      return errorBody(c, 400, `request body is not a JSON object: ${(e as Error).message}`);
    }
    metrics.request("disaggregated");
    const signal = c.req.raw.signal;
    const headers = forwardHeaders(c.req.raw.headers);
    if (!headers.has(REQUEST_ID)) headers.set(REQUEST_ID, randomUUID());
    headers.set("content-type", "application/json");
    // The EPP names the prefill rank apart from the destination's (the decode leg keeps its own): it
    // is the prefill leg's rank header. Without it the prefill worker picks a rank itself.
    const prefillHeaders = new Headers(headers);
    prefillHeaders.delete(DP_RANK_HEADER);
    // It names a rank of the EPP's prefill worker, the first candidate: another one drawn picks its own.
    const prefillRank = c.req.header(PREFILL_RANK_HEADER);
    if (prefillRank !== undefined && prefiller === candidates[0]) prefillHeaders.set(DP_RANK_HEADER, prefillRank);

    if (config.kvConnector === "sglang" || config.kvConnector === "mooncake") {
      const legs = { prefiller, target, client, decoder, decodeHeaders: headers, prefillHeaders, prefillTimeoutMs: config.prefillTimeoutMs, signal, closing, metrics, log };
      try {
        const res = config.kvConnector === "sglang"
          ? await sglangLegs({ ...legs, bootstrapPort: config.sglangBootstrapPort })
          : await mooncakeLegs({
            ...legs, api, bootstrapPort: config.mooncakeBootstrapPort, engines,
            // The EPP's rank is for its prefill worker, the first candidate (as above).
            prefillRank: prefiller === candidates[0] ? prefillRank : undefined,
          });
        return answer(res, res.body);
      } catch (err) {
        if (err instanceof BootstrapError) {
          metrics.failed(err.reason);
          log.warn({ err, peer: prefiller }, "Mooncake bootstrap query failed");
          return errorBody(c, 502, err.message);
        }
        if (signal.aborted) return c.body(null, 499 as never);
        // Counted and logged by the prefill leg (concurrent-legs.ts), its decode leg cut.
        if (err instanceof PrefillLegFailed) return errorBody(c, 502, err.message);
        metrics.failed("decoder_unreachable");
        log.warn({ err }, "decode worker unreachable");
        return errorBody(c, 502, `decode worker unreachable: ${(err as Error).message}`);
      }
    }

    // The prefill leg: its answer is read whole (it is one token, and carries the transfer parameters).
    const started = performance.now();
    const leg = await sendPrefill(
      `http://${prefiller}${target}`, { headers: prefillHeaders, body: JSON.stringify(prefillBody(client, api)) }, signal,
      { maxRetries: config.prefillMaxRetries, backoffMs: config.prefillRetryBackoffMs, timeoutMs: config.prefillTimeoutMs },
      (reason) => {
        metrics.retried(reason);
        log.info({ peer: prefiller, reason, requestId: headers.get(REQUEST_ID) }, "retrying prefill leg");
      },
    );
    if (leg.kind === "client_gone") {
      metrics.failed("client_closed");
      return c.body(null, 499 as never);
    }
    if (leg.kind === "unreachable") {
      metrics.failed("prefill_unreachable");
      log.warn({ err: leg.error, peer: prefiller }, "prefill worker unreachable");
      return errorBody(c, 502, `prefill worker ${prefiller} unreachable: ${(leg.error as Error)?.message ?? String(leg.error)}`);
    }
    metrics.prefillSeconds((performance.now() - started) / 1000);
    const { res: pres, text: ptext } = leg;
    if (!pres.ok) {
      // The prefill worker's own error (a 400 for a bad request, say; the last one when retries ran out) is the client's answer.
      metrics.failed("prefill_status");
      log.warn({ peer: prefiller, status: pres.status }, "prefill leg failed");
      return answer(pres, ptext);
    }
    let outcome: ReturnType<typeof prefillOutcome>;
    try {
      outcome = prefillOutcome(JSON.parse(ptext), api);
    } catch {
      metrics.failed("prefill_answer");
      return errorBody(c, 502, `prefill worker ${prefiller} answered with something other than JSON`);
    }
    // Without parameters the decode worker prefills itself: slower, still right.
    if (outcome.kvTransferParams === null) log.warn({ peer: prefiller }, "prefill answer without kv_transfer_params");

    let dres: Response;
    try {
      dres = await fetch(`${decoder}${target}`, {
        method: "POST", headers, body: JSON.stringify(decodeBody(client, outcome.kvTransferParams)), signal,
      });
    } catch (err) {
      if (signal.aborted) return c.body(null, 499 as never);
      metrics.failed("decoder_unreachable");
      log.warn({ err }, "decode worker unreachable");
      return errorBody(c, 502, `decode worker unreachable: ${(err as Error).message}`);
    }
    const spec = SPLIT_APIS[api];
    if (!dres.ok || !dres.body || !spec.cached) return answer(dres, dres.body);
    const sse = (dres.headers.get("content-type") ?? "").includes("text/event-stream");
    return answer(dres, sse ? rewriteSse(dres.body, outcome.cachedTokens, spec) : rewriteJson(await dres.text(), outcome.cachedTokens, spec));
  };

  app.post("*", async (c, next) => {
    const { pathname, search } = new URL(c.req.url);
    const api = splitPath(pathname);
    return api === undefined ? next() : disaggregated(c, api, pathname + search);
  });
  app.get("/sidecar/metrics", async (c) => c.text(await metrics.registry.metrics(), 200, { "content-type": metrics.registry.contentType }));
  app.all("*", async (c) => {
    metrics.request("passthrough");
    return passThrough(c);
  });
  return app;
}

/** Starts the sidecar; options not given take the CLI defaults. */
export async function startSidecar(opts: SidecarOptions = {}): Promise<Sidecar> {
  const { logger, ...given } = opts;
  const config = resolveConfig(given);
  const log = (logger ?? pino({ level: config.logLevel })).child({ component: "pd-sidecar" });
  // close() also ends the prefill legs still running in the background (concurrent-legs.ts).
  const closing = new AbortController();
  const server = Bun.serve({ hostname: config.listen, port: config.port, fetch: sidecarApp(config, log, createMetrics(), closing.signal).fetch, idleTimeout: 0 });
  const host = config.listen === "0.0.0.0" ? "127.0.0.1" : config.listen === "::" ? "::1" : config.listen;
  const url = `http://${hostPort(host, server.port!)}`;
  log.info({ url, decoder: config.decoder, allowedPrefillers: config.allowedPrefillers }, "pd sidecar listening");
  return {
    url, config, close: async () => {
      closing.abort();
      await server.stop(true);
    },
  };
}
