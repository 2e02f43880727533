// Static mode: the worker set comes from the config file and never changes.
import type { WorkerSpec } from "@kv-epp/protocol";
import type { StaticWorker } from "../config.ts";
import { apiServers } from "./api-servers.ts";

/** An entry with several addresses has `dpSize` ranks behind each (rank i*dpSize + r on address i). */
export function staticWorkers(list: StaticWorker[]): WorkerSpec[] {
  return list.map((w) => {
    const addresses = typeof w.address === "string" ? [w.address] : w.address;
    const start = w.dpStartRank;
    const servers = apiServers(addresses, w.dpSize, start, w.dpLb ?? "internal");
    return {
      id: w.id,
      address: addresses[0]!,
      ...(servers ? { servers } : {}),
      kvEvents: w.kvEvents,
      replay: w.replay,
      dpSize: w.dpSize * addresses.length,
      ...(start > 0 ? { dpStartRank: start } : {}),
      ...(w.kvEventsBind ? { kvBind: true } : {}),
      metricsUrl: w.metrics ?? `http://${addresses[0]}/metrics`,
      ...(w.role ? { role: w.role } : {}),
    };
  });
}
