// The intents source on its own: a store that accepts connections and never answers is given up on
// after the open timeout and retried (each attempt counted), and stop() ends the loop.
import { afterEach, expect, test } from "bun:test";
import { createServer, type Socket } from "node:net";
import { quietLog } from "../test/helpers.ts";
import { startIntentSource } from "./intents-source.ts";

const HOST = "127.0.4.73";
const cleanup: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c().catch(() => {});
});

test("an open that never settles times out, counts, and is retried", async () => {
  const sockets: Socket[] = [];
  const hung = createServer((s) => {
    sockets.push(s);
    s.resume();
    s.on("error", () => {});
  });
  await new Promise<void>((r) => hung.listen(0, HOST, () => r()));
  cleanup.push(() => new Promise<void>((r) => (sockets.forEach((s) => s.destroy()), hung.close(() => r()))));
  let errors = 0;
  const source = startIntentSource({
    where: { kind: "http", url: `http://${HOST}:${(hung.address() as { port: number }).port}` },
    hostInstance: "dynamo-epp",
    kubeConfig: () => undefined,
    log: quietLog,
    countError: () => errors++,
    onWorkers: () => {},
    backoff: { initialMs: 20, maxMs: 50 },
    openTimeoutMs: 100,
  });
  cleanup.push(() => source.stop());
  await source.firstAttempt;
  const deadline = Date.now() + 10_000;
  while (sockets.length < 3 || errors < 2) {
    if (Date.now() > deadline) throw new Error(`not retried: ${sockets.length} connections, ${errors} errors`);
    await Bun.sleep(20);
  }
  await source.stop();
  const after = sockets.length;
  await Bun.sleep(300);
  expect(sockets.length).toBe(after); // no attempt after stop
});
