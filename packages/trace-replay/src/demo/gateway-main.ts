// The demo gateway as a process: `bun packages/trace-replay/src/demo/gateway-main.ts --listen IP --port N
// --body-mode full-duplex|buffered --replicas name=ip:port,...`. The demo starts and stops it; SIGTERM
// stops it.
import { z } from "zod";
import { FlagError, parseFlags } from "../cli-flags.ts";
import { parseReplicas, startGateway } from "./gateway.ts";

const schema = z.object({
  listen: z.string().min(1),
  port: z.coerce.number().int().min(1).max(65535).default(8080),
  "body-mode": z.enum(["full-duplex", "buffered"]).default("full-duplex"),
  replicas: z.string().min(1),
});

let gateway: ReturnType<typeof startGateway>;
try {
  const o = parseFlags(schema, process.argv.slice(2));
  gateway = startGateway({ listen: o.listen, port: o.port, bodyMode: o["body-mode"], replicas: parseReplicas(o.replicas) });
} catch (e) {
  console.error(`gateway: ${e instanceof Error ? e.message : String(e)}`);
  process.exit(e instanceof FlagError ? 2 : 1);
}
console.log(`gateway listening on ${gateway.url}`);
for (const sig of ["SIGINT", "SIGTERM"] as const) process.on(sig, () => void gateway.stop().then(() => process.exit(0)));
