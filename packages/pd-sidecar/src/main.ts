// `bun run pd-sidecar [flags]`: the P/D sidecar in front of a decode worker. Flags also read PD_SIDECAR_*
// variables. Exit codes: 2 for a bad flag or variable (named in the message), 1 when it cannot start.
import { ConfigError, parseConfig, usage } from "./config.ts";
import { startSidecar, type Sidecar } from "./server.ts";

async function start(args: string[]): Promise<Sidecar> {
  if (args.includes("--help") || args.includes("-h")) {
    console.log(usage());
    process.exit(0);
  }
  try {
    return await startSidecar(parseConfig(args, process.env));
  } catch (e) {
    console.error(`pd-sidecar: ${e instanceof ConfigError ? "" : "failed to start: "}${(e as Error)?.message ?? String(e)}`);
    return process.exit(e instanceof ConfigError ? 2 : 1);
  }
}

const sidecar = await start(process.argv.slice(2));
for (const signal of ["SIGINT", "SIGTERM"] as const)
  process.on(signal, () => void sidecar.close().then(() => process.exit(0)));
