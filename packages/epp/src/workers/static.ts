// Static mode: the worker set comes from the config file and never changes.
import type { StaticWorker } from "../config.ts";
import type { WorkerSpec } from "./registry.ts";

export function staticWorkers(list: StaticWorker[]): WorkerSpec[] {
  return list.map((w) => ({
    id: w.id,
    address: w.address,
    kvEvents: w.kvEvents,
    replay: w.replay,
    dpSize: w.dpSize,
    metricsUrl: w.metrics ?? `http://${w.address}/metrics`,
  }));
}
