// Shared test fixtures: descriptors, a store with a live host, a sleep that records its delays.
import { expect } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import pino from "pino";
import { Writable } from "node:stream";
import { advertiseHost, indexerDomainOf, MemoryDiscoveryStore, VLLM_KV_EVENTS_PROTOCOL, type IntentDescriptor, type Sleep } from "../src/index.ts";
import { ControllableDiscovery } from "./double.ts";
import { LOOPBACK, tempDir } from "@kv-epp/testkit";

export const WORKER = "worker-a";
export const HOST = "dynamo-epp";
export const DOMAIN = indexerDomainOf("Qwen/Qwen3-0.6B");

export function descriptor(dpRank: number, over: Partial<IntentDescriptor> = {}): IntentDescriptor {
  return {
    workerId: WORKER,
    dpRank,
    protocol: VLLM_KV_EVENTS_PROTOCOL,
    endpoint: `tcp://${LOOPBACK}.7.1:${5557 + dpRank}`,
    replayEndpoint: `tcp://${LOOPBACK}.7.1:${5600 + dpRank}`,
    topic: "kv@worker-a",
    blockSize: 16,
    model: "Qwen/Qwen3-0.6B",
    tenant: "default",
    indexerDomain: DOMAIN,
    cacheOwners: [{ id: "gpu", indexerDomain: DOMAIN }],
    multimodalTokenIds: [151652, 151655],
    ...over,
  };
}

/** A store with the host advertised, and the worker's discovery as a controllable double. */
export async function withHost() {
  const store = new MemoryDiscoveryStore();
  const hostSide = store.connect({ producer: "epp-0" });
  await advertiseHost({ discovery: hostSide, hostInstance: HOST });
  const worker = new ControllableDiscovery(store.connect({ producer: "worker-a-proc" }));
  const intents = () => store.snapshot("intent");
  return { store, hostSide, worker, intents };
}

/** Resolves at once (next microtask) and records each requested delay. */
export function recordingSleep(onSleep?: (n: number) => void): { sleep: Sleep; delays: number[] } {
  const delays: number[] = [];
  return {
    delays,
    sleep: async (ms) => {
      delays.push(ms);
      onSleep?.(delays.length);
    },
  };
}

/** A pino logger whose lines are kept for assertions. */
export function capturingLogger() {
  const lines: Record<string, unknown>[] = [];
  const stream = new Writable({
    write(chunk, _enc, cb) {
      for (const l of String(chunk).split("\n")) if (l) lines.push(JSON.parse(l));
      cb();
    },
  });
  return { log: pino({ level: "debug" }, stream), lines };
}

/** The model the end-to-end tests' workers serve and their EPPs index. */
export const E2E_MODEL = "e2e-model";

/** A static EPP config file with no listed workers: every worker comes through its intents. */
export function emptyEppConfig(prefix: string): string {
  const file = join(tempDir(prefix), "epp.json");
  writeFileSync(file, JSON.stringify({ model: E2E_MODEL, blockSize: 16, workers: [] }));
  return file;
}

/** One completion on the worker at `url`, pinned to DP rank `rank`. */
export async function complete(url: string, rank: number, prompt: string): Promise<void> {
  const res = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-data-parallel-rank": String(rank) },
    body: JSON.stringify({ model: E2E_MODEL, prompt, max_tokens: 1 }),
  });
  expect(res.status).toBe(200);
  await res.arrayBuffer();
}
