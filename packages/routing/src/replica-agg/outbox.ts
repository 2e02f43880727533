// replica-agg's sending side as state: this replica's messages numbered (one replica id, seq +1 per
// message), and a turn's changes cut into deltas no subscriber's frame bound refuses. The EPP's
// publisher sends them on a PUB socket; the simulation delivers them in virtual time.
import type { ActiveLoad } from "../load.ts";
import { entryOf, type AggMessage, type AggOp } from "./codec.ts";

/** Numbers this replica's messages: one replica id per process start, seq +1 per message from 0. */
export class AggOutbox {
  private seq = 0;

  constructor(readonly replica: string) {}

  delta(ops: AggOp[]): AggMessage {
    return { kind: "delta", replica: this.replica, seq: this.seq++, ops };
  }

  snapshot(load: ActiveLoad): AggMessage {
    const entries = [...load.entries()].map(([id, e]) => entryOf(id, e));
    return { kind: "snapshot", replica: this.replica, seq: this.seq++, entries };
  }
}

/**
 * Prefix keys one delta carries at most (512 KiB of them): a turn's changes past it go out as further
 * deltas, in order, so no message nears a subscriber's 8 MiB frame bound however many requests one
 * event-loop turn routes (a delta over it would close the session and drop this replica's whole load there).
 */
export const DELTA_MAX_PREFIX_KEYS = 1 << 16;

/** One turn's ops cut into deltas of at most DELTA_MAX_PREFIX_KEYS prefix keys each (an op is never split). */
export function deltaParts(ops: AggOp[], maxKeys = DELTA_MAX_PREFIX_KEYS): AggOp[][] {
  const parts: AggOp[][] = [];
  let part: AggOp[] = [];
  let keys = 0;
  for (const o of ops) {
    const n = o.op === "added" ? (o.prefix?.length ?? 0) : 0;
    if (keys + n > maxKeys && part.length > 0) {
      parts.push(part);
      part = [];
      keys = 0;
    }
    part.push(o);
    keys += n;
  }
  if (part.length > 0) parts.push(part);
  return parts;
}
