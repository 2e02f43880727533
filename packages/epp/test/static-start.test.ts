// A static-mode EPP (workers from its config file, recovery and replica-agg peers static) starts and becomes
// ready without loading @kubernetes/client-node: only a source that reads the API server loads the client
// (src/kube-sources.ts), so static mode does not pay for loading it.
import { afterAll, expect, test } from "bun:test";
import { join } from "node:path";
import { killAll, spawnBun } from "@kv-epp/testkit";
import { KUBE_CLIENT_LOADED } from "./fixtures/kube-client-marker.ts";
import { HOST, writeStaticConfig } from "./helpers.ts";

const PROBE = join(import.meta.dir, "fixtures/kube-client-probe.ts");
const EPP_DIR = join(import.meta.dir, "..");

afterAll(() => killAll());

test("the probe sees @kubernetes/client-node loaded", async () => {
  const p = spawnBun(["--preload", PROBE, "-e", 'await import("@kubernetes/client-node")'], {}, { name: "probe", cwd: EPP_DIR });
  await p.exited;
  expect(p.output()).toContain(KUBE_CLIENT_LOADED);
});

test("a static-mode EPP becomes ready without loading @kubernetes/client-node", async () => {
  const config = writeStaticConfig([{ id: "worker-a", address: `${HOST}:8000`, kvEvents: `tcp://${HOST}:15557` }]);
  const epp = spawnBun(
    [
      "--preload", PROBE, "src/main.ts", "--config", config, "--listen", HOST,
      "--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0", "--selection-port", "0", "--replica-agg-port", "0",
      "--subscribe-wait-ms", "100", "--warm-up-picks", "0",
    ],
    {},
    { name: "epp", cwd: EPP_DIR },
  );
  await epp.waitForLog(/servers listening/, { timeoutMs: 20_000 });
  await epp.waitForLog(/ready with an EMPTY KV index/, { timeoutMs: 20_000 });
  expect(epp.output()).not.toContain(KUBE_CLIENT_LOADED);
}, 60_000);
