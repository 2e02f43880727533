// `bun run kv-sidecar`: runs beside a vLLM worker, reads where its ranks publish KV events (what the
// worker reports: reported-sources.ts) and keeps one attachment intent per rank registered until it is
// stopped (SIGTERM/SIGINT withdraws them). A report it cannot use is logged, and the process stays up idle.
import { ConfigError, group, opt, positive, resolveOptions, usageText } from "@kv-epp/options";
import pino from "pino";
import { z } from "zod";
import { openDiscovery, parseDiscoveryConfig } from "./discovery/open.ts";
import { registerReportedIntents } from "./reported-intents.ts";

const SIDECAR_OPTIONS = group("kv-sidecar", {
  from: opt.string(z.string().min(1), "where the worker reports its KV-event sources: http://HOST:PORT (vLLM's GET /kv_event_sources, else SGLang's GET /server_info) or grpc://HOST:PORT"),
  discovery: opt.string(z.string().min(1), "where intents are registered: kubernetes | http://HOST:PORT"),
  workerId: opt.string(z.string().min(1), "the worker's id in its intents"),
  model: opt.string(z.string().min(1), "served model name"),
  blockSize: opt.int(positive, "KV block size in tokens"),
  kvHost: opt.string(z.string().min(1).default("dynamo-epp"), "host instance (EPP) the intents are addressed to"),
  address: opt.string(z.string().min(1).optional(), "the worker's API server, IP:PORT"),
  advertiseHost: opt.string(z.string().min(1).optional(), "IP the EPP reaches the worker on (pod IP), written in intents"),
  tenant: opt.string(z.string().min(1).optional(), "tenant of the indexer key"),
  logLevel: opt.choice(["fatal", "error", "warn", "info", "debug", "trace", "silent"], "info", "pino level"),
});
const USAGE = usageText(SIDECAR_OPTIONS, { command: "bun run kv-sidecar", note: "Flags only (no environment variables)." });

if (process.argv.includes("--help")) {
  console.log(USAGE);
  process.exit(0);
}
let o;
try {
  o = resolveOptions(SIDECAR_OPTIONS, {}, { argv: process.argv.slice(2) }).values;
} catch (e) {
  if (!(e instanceof ConfigError)) throw e;
  console.error(`kv-sidecar: ${e.message}\n${USAGE}`);
  process.exit(2);
}
const log = pino({ level: o.logLevel }).child({ component: "kv-sidecar", worker: o.workerId });
const abort = new AbortController();
const discovery = await openDiscovery(parseDiscoveryConfig(o.discovery, process.env), { log });
const registered = registerReportedIntents({
  from: o.from, discovery, workerId: o.workerId, controlTarget: o.kvHost, model: o.model, blockSize: o.blockSize,
  ...(o.tenant ? { tenant: o.tenant } : {}), ...(o.address ? { address: o.address } : {}), ...(o.advertiseHost ? { advertiseHost: o.advertiseHost } : {}),
  retry: true, signal: abort.signal, log,
});
// Kept alive while idle: nothing else may hold the event loop once registering gave up.
let idle: ReturnType<typeof setInterval> | undefined;
registered.then(
  ({ reported }) => log.info({ ranks: reported.sources }, "KV attachment intents registered from the worker's reported sources"),
  (err: unknown) => {
    if (abort.signal.aborted) return;
    // Not retriable (a report that cannot be used as made, several topics, an invalid descriptor): the worker
    // reports the same after a restart, so exiting would only crash-loop the pod beside a worker that serves.
    // This worker's ranks are just not attached through intents; the sidecar idles until it is stopped.
    log.error(
      { err: String(err), kind: err instanceof Error ? err.constructor.name : typeof err },
      "KV attachment intents NOT registered, and will not be: fix the worker's report or state its ranks another way; idle until stopped",
    );
    idle = setInterval(() => {}, 1 << 30);
  },
);
const stop = async () => {
  clearInterval(idle);
  abort.abort(new Error("sidecar stopping"));
  const r = await registered.catch(() => undefined);
  await r?.owner.close();
  await discovery.close();
  process.exit(0);
};
process.once("SIGTERM", stop);
process.once("SIGINT", stop);
