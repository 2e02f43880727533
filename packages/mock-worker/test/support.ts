// Shared fixtures for the mock worker's tests: a KV-event subscriber built on @kv-epp/kv-events and JSON
// requests (polling is the testkit's waitFor).
import { decodeBatch, decodeSeq, SubSocket, type KvEventBatch } from "@kv-epp/kv-events";
import { waitFor } from "@kv-epp/testkit";

export type Received = { topic: string; seq: bigint; batch: KvEventBatch; payload: Buffer };

/** Subscribes to one rank's PUB endpoint and keeps every decoded message. */
export function subscribe(endpoint: string, topic = "") {
  const sock = new SubSocket();
  const messages: Received[] = [];
  sock.onMessage((frames) => {
    messages.push({ topic: frames[0]!.toString(), seq: decodeSeq(frames[1]!)!, batch: decodeBatch(frames[2]!), payload: frames[2]! });
  });
  sock.subscribe(topic);
  sock.connect(endpoint);
  return { messages, close: () => sock.close() };
}

export function post(url: string, body: unknown, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });
}

/**
 * PUB drops what it sends before a subscription arrives (ZeroMQ's slow joiner), so tests first reset
 * the cache until every subscriber has seen the AllBlocksCleared, then forget what came before.
 */
export async function syncSubscribers(url: string, subs: { messages: Received[] }[]): Promise<void> {
  const seen = (s: { messages: Received[] }) => s.messages.some((m) => m.batch.events.some((e) => e.type === "AllBlocksCleared"));
  await waitFor(async () => {
    if (subs.every(seen)) return true;
    await fetch(`${url}/reset_prefix_cache`, { method: "POST" });
    await Bun.sleep(20);
    return subs.every(seen);
  }, { message: "subscribers to receive AllBlocksCleared" });
  // Wait out resets still in flight: each subscriber (subs[r] listens to rank r) has the last seq sent.
  const state = (await (await fetch(`${url}/admin/faults`)).json()) as { ranks: { nextSeq: string }[] };
  await waitFor(() => subs.every((s, r) => s.messages.at(-1)?.seq === BigInt(state.ranks[r]!.nextSeq) - 1n), { message: "the last reset" });
  for (const s of subs) s.messages.length = 0;
}

/** Hashes a subscriber sees as resident after applying everything it received, in order. */
export function residentFromEvents(messages: Received[]): Set<bigint> {
  const held = new Set<bigint>();
  for (const m of messages)
    for (const e of m.batch.events) {
      if (e.type === "BlockStored") for (const h of e.blockHashes) held.add(h);
      else if (e.type === "BlockRemoved") for (const h of e.blockHashes) held.delete(h);
      else held.clear();
    }
  return held;
}
