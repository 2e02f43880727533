// The intents source on its own: a store that accepts connections and never answers is given up on
// after the open timeout and retried (each attempt counted), and stop() ends the loop.
import { afterEach, expect, test } from "bun:test";
import { hungServer, quietLog } from "../test/helpers.ts";
import { startIntentSource } from "./intents-source.ts";
import { LOOPBACK } from "@kv-epp/testkit";

const HOST = `${LOOPBACK}.4.73`;
const cleanup: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c().catch(() => {});
});

test("an open that never settles times out, counts, and is retried", async () => {
  const hung = await hungServer(HOST);
  cleanup.push(() => hung.close());
  let errors = 0;
  const source = startIntentSource({
    where: { kind: "http", url: hung.url },
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
  while (hung.connections() < 3 || errors < 2) {
    if (Date.now() > deadline) throw new Error(`not retried: ${hung.connections()} connections, ${errors} errors`);
    await Bun.sleep(20);
  }
  await source.stop();
  const after = hung.connections();
  await Bun.sleep(300);
  expect(hung.connections()).toBe(after); // no attempt after stop
});
