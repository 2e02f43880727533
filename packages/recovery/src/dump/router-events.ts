import type { RouterEvent } from "@kv-epp/protocol";

/** An index's own dump event, described structurally: recovery does not depend on the index package. */
export type IndexDumpEvent = {
  worker: { workerId: string; dpRank: number };
  parentHash: bigint | null;
  blocks: readonly { blockHash: bigint; tokensHash: bigint; copies?: number }[];
};

/** An index's dump, parents first, as `/dump` RouterEvents numbered from 0 as they stream. */
export function* toRouterEvents(events: Iterable<IndexDumpEvent>): Generator<RouterEvent> {
  let eventId = 0;
  for (const e of events) {
    yield {
      workerId: e.worker.workerId,
      dpRank: e.worker.dpRank,
      eventId: eventId++,
      parentHash: e.parentHash,
      blocks: e.blocks.map((b) => (b.copies === undefined ? { blockHash: b.blockHash, tokensHash: b.tokensHash } : { blockHash: b.blockHash, tokensHash: b.tokensHash, copies: b.copies })),
    };
  }
}
