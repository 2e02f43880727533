// `bun run kv-sidecar`: runs beside a vLLM worker, reads where its ranks publish KV events (what the
// worker reports: reported-sources.ts) and keeps one attachment intent per rank registered until it is
// stopped (SIGTERM/SIGINT withdraws them).
import { parseArgs } from "node:util";
import pino from "pino";
import { openDiscovery, parseDiscoveryConfig } from "./discovery/open.ts";
import { registerReportedIntents } from "./reported-intents.ts";

const USAGE = `bun run kv-sidecar --from http://HOST:PORT|grpc://HOST:PORT --discovery kubernetes|http://HOST:PORT
  --worker-id ID --model NAME --block-size N [--kv-host dynamo-epp] [--address IP:PORT] [--advertise-host IP] [--tenant T]`;

const { values: v } = parseArgs({
  options: {
    from: { type: "string" }, discovery: { type: "string" }, "worker-id": { type: "string" }, model: { type: "string" },
    "block-size": { type: "string" }, "kv-host": { type: "string", default: "dynamo-epp" }, address: { type: "string" },
    "advertise-host": { type: "string" }, tenant: { type: "string" }, "log-level": { type: "string", default: "info" },
  },
});
const blockSize = Number(v["block-size"]);
if (!v.from || !v.discovery || !v["worker-id"] || !v.model || !Number.isSafeInteger(blockSize) || blockSize < 1) {
  console.error(USAGE);
  process.exit(2);
}
const log = pino({ level: v["log-level"] }).child({ component: "kv-sidecar", worker: v["worker-id"] });
const abort = new AbortController();
const discovery = await openDiscovery(parseDiscoveryConfig(v.discovery, process.env), { log });
const registered = registerReportedIntents({
  from: v.from, discovery, workerId: v["worker-id"], controlTarget: v["kv-host"]!, model: v.model, blockSize,
  ...(v.tenant ? { tenant: v.tenant } : {}), ...(v.address ? { address: v.address } : {}), ...(v["advertise-host"] ? { advertiseHost: v["advertise-host"] } : {}),
  retry: true, signal: abort.signal, log,
});
registered.then(
  ({ reported }) => log.info({ ranks: reported.sources }, "KV attachment intents registered from the worker's reported sources"),
  async (err: unknown) => {
    if (abort.signal.aborted) return;
    // Not retriable (an invalid descriptor, several topics): nothing this process can do about it.
    log.error({ err: String(err) }, "KV attachment intents not registered");
    await discovery.close();
    process.exit(1);
  },
);
const stop = async () => {
  abort.abort(new Error("sidecar stopping"));
  const r = await registered.catch(() => undefined);
  await r?.owner.close();
  await discovery.close();
  process.exit(0);
};
process.once("SIGTERM", stop);
process.once("SIGINT", stop);
