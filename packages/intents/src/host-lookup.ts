// The worker side addresses its intents to exactly one KV-state host: the one live advertisement of
// the current protocol version whose host instance is the worker's control target.
import type { Logger } from "pino";
import type { Discovery } from "./discovery/types.ts";
import { decodeHost, HOST_PROTOCOL_VERSION, type HostAdvertisement } from "./protocol.ts";

export class HostLookupError extends Error {
  override name = "HostLookupError";
  constructor(
    readonly controlTarget: string,
    readonly count: number,
  ) {
    super(`expected exactly one live KV host ${JSON.stringify(controlTarget)} (protocol v${HOST_PROTOCOL_VERSION}), found ${count}`);
  }
}

export async function findHost(discovery: Discovery, controlTarget: string, log: Logger): Promise<HostAdvertisement> {
  const matches: HostAdvertisement[] = [];
  for (const rec of await discovery.list({ kind: "host" })) {
    let ad: HostAdvertisement;
    try {
      ad = decodeHost(rec.payload);
    } catch (err) {
      log.warn({ record: rec.name, producer: rec.producer, err: String(err) }, "skipping undecodable host advertisement");
      continue;
    }
    if (ad.version === HOST_PROTOCOL_VERSION && ad.hostInstance === controlTarget) matches.push(ad);
  }
  if (matches.length !== 1) throw new HostLookupError(controlTarget, matches.length);
  return matches[0]!;
}
