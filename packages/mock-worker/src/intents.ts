// With --discovery, the worker registers one KV attachment intent per DP rank (@kv-epp/intents),
// retrying in the background until the EPP is advertised; close() withdraws them.
import { openDiscovery, parseDiscoveryConfig, registerWorkerIntents } from "@kv-epp/intents";
import pino from "pino";
import { poolRole } from "./config.ts";
import type { MockWorker } from "./worker.ts";

const CLOSE_BUDGET_MS = 5_000;

export function registerIntents(worker: MockWorker, env: Record<string, string | undefined>): { close(): Promise<void> } {
  const { config } = worker;
  if (!config.discovery) return { close: async () => {} };
  const workerId = config.workerId ?? new URL(worker.url).host;
  const log = pino({ level: config.logLevel }).child({ component: "intents", worker: workerId });
  const abort = new AbortController();
  const registered = (async () => {
    const discovery = await openDiscovery(parseDiscoveryConfig(config.discovery!, env), { log });
    const owner = await registerWorkerIntents({
      discovery,
      workerId,
      controlTarget: config.kvHost,
      model: config.model,
      blockSize: config.blockSize,
      topic: config.topic,
      ranks: worker.ranks,
      address: new URL(worker.url).host,
      metricsUrl: `${worker.url}/metrics`,
      advertiseHost: config.advertiseHost,
      // A hybrid-LB node's server numbers its ranks from 0: the EPP must know to send that numbering.
      ...(config.dataParallelHybridLb ? { dpLb: "hybrid" as const } : {}),
      // The EPP sorts a P/D pool's workers by it (a prefill worker is never a destination).
      ...(poolRole(config) ? { role: poolRole(config) } : {}),
      retry: true,
      signal: abort.signal,
      log,
    }).catch(async (err: unknown) => {
      await discovery.close();
      throw err;
    });
    return { owner, discovery };
  })();
  registered.catch((err: unknown) => {
    if (!abort.signal.aborted) log.error({ err: String(err) }, "KV attachment intents not registered");
  });
  return {
    close: async () => {
      abort.abort(new Error("worker stopping"));
      const r = await registered.catch(() => undefined);
      if (!r) return;
      // Withdrawal retries until the lease ends; bounded here, since closing the discovery ends the lease
      // (the store, or the pod's garbage collection in Kubernetes, removes whatever is left).
      await Promise.race([r.owner.close(), new Promise((done) => setTimeout(done, CLOSE_BUDGET_MS))]);
      await r.discovery.close();
    },
  };
}
