// The demo gateway as a process: `bun packages/trace-replay/src/demo/gateway-main.ts --listen IP --port N
// --body-mode full-duplex|buffered --replicas name=ip:port,...`. The demo starts and stops it; SIGTERM
// stops it.
import { ConfigError, group, opt, port, resolveOptions } from "@kv-epp/options";
import { z } from "zod";
import { parseReplicas, startGateway } from "./gateway.ts";

const GATEWAY_OPTIONS = group("Gateway", {
  listen: opt.string(z.string().min(1), "address the gateway binds"),
  port: opt.int(port.min(1).default(8080), "gateway port"),
  bodyMode: opt.choice(["full-duplex", "buffered"], "full-duplex", "ext_proc request body mode"),
  replicas: opt.string(z.string().min(1), "the EPP replicas' ext_proc endpoints, name=ip:port,..."),
});

let gateway: ReturnType<typeof startGateway>;
try {
  const o = resolveOptions(GATEWAY_OPTIONS, {}, { argv: process.argv.slice(2) }).values;
  gateway = startGateway({ listen: o.listen, port: o.port, bodyMode: o.bodyMode, replicas: parseReplicas(o.replicas) });
} catch (e) {
  console.error(`gateway: ${e instanceof Error ? e.message : String(e)}`);
  process.exit(e instanceof ConfigError ? 2 : 1);
}
console.log(`gateway listening on ${gateway.url}`);
for (const sig of ["SIGINT", "SIGTERM"] as const) process.on(sig, () => void gateway.stop().then(() => process.exit(0)));
