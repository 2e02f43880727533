// `bun run mock-worker [flags]`: a GPU-less vLLM stand-in. Flags also read MOCK_WORKER_* variables.
import { ConfigError, parseConfig, usage } from "./config.ts";
import { registerIntents } from "./intents.ts";
import { startMockWorker } from "./worker.ts";

const args = process.argv.slice(2);
if (args.includes("--help") || args.includes("-h")) {
  console.log(usage());
  process.exit(0);
}

let config;
try {
  config = parseConfig(args, process.env);
} catch (e) {
  if (!(e instanceof ConfigError)) throw e;
  console.error(`mock-worker: ${e.message}`);
  process.exit(2);
}

const worker = await startMockWorker(config).catch((e: unknown) => {
  // e.g. a port already in use: say which, without a stack trace.
  console.error(`mock-worker: failed to start: ${(e as Error)?.message ?? String(e)}`);
  process.exit(1);
});
const intents = registerIntents(worker, process.env);
let stopping = false;
const stop = async () => {
  if (stopping) return;
  stopping = true;
  // Intents first: the EPP detaches before the KV publishers go away.
  await intents.close();
  await worker.close();
  process.exit(0);
};
process.on("SIGINT", stop);
process.on("SIGTERM", stop);
