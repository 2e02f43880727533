// Which pool member takes a job. Each member has its own segment cache, so a conversation is cheap only on the
// member that tokenized its earlier turns: elsewhere every section is fresh. Measured on the agentic workload
// (sessions to ~100k tokens), a turn sent to an idle stranger instead of its busy home re-tokenized the whole
// conversation to save a wait of a few milliseconds, and the next turn then missed on both members.
import type { PoolJob } from "../job";
import { ROUTING_TEXT_CHARS } from "../request/routing-job";

/** How a request was placed: on the member holding its conversation, moved off it, or a conversation not seen. */
export type PlacementKind = "affine" | "moved" | "new";

/**
 * A cached character costs about a tenth of a fresh one (render, cut, hash and look up against BPE): measured
 * ~1 ms for 128 Ki cached characters of the agentic workload, ~10 ms fresh.
 */
const CACHED_CHAR_COST = 0.1;

/** Conversations remembered (their member and length), least recently placed forgotten first. */
export const DEFAULT_MAX_REMEMBERED = 16_384;

export type Placed = { member: number; cost: number; kind: PlacementKind };

/**
 * The placement policy, apart from the threads so it can be tested as a function. Costs are in units of one
 * fresh character, so no rate has to be learned: what matters is only which member finishes the job first.
 * A job of a conversation seen before goes to the member that took its last turn, busy or not, unless that
 * member's backlog plus the job's cost there (its new characters fresh, the rest cached) exceeds another
 * member's backlog plus the whole job fresh. A conversation not seen goes to the least loaded member (its
 * hash's member on a tie, so an idle pool spreads them), which is remembered for its next turns.
 */
export class Placement {
  private readonly homes = new Map<number, { member: number; chars: number }>();

  constructor(private readonly size: number, private readonly maxRemembered = DEFAULT_MAX_REMEMBERED) {}

  /**
   * `chars`: what the job tokenizes; `read`: what reading it costs any member (jobWork). `backlogs[i]`: the cost of
   * what member i is running and has queued for requests (see `cost` of Placed). `move: false` (background work):
   * the member holding the conversation whatever its backlog.
   */
  place(key: number, chars: number, backlogs: readonly number[], move = true, read = 0): Placed {
    const known = this.homes.get(key);
    let placed: Placed;
    if (known !== undefined) {
      const fresh = Math.max(0, chars - known.chars);
      const own = fresh + (chars - fresh) * CACHED_CHAR_COST + read;
      placed = { member: known.member, cost: own, kind: "affine" };
      if (move) {
        for (let i = 0; i < this.size; i++) {
          if (backlogs[i]! + chars + read < backlogs[placed.member]! + placed.cost) placed = { member: i, cost: chars + read, kind: "moved" };
        }
      }
    } else {
      const home = key % this.size;
      placed = { member: home, cost: chars + read, kind: "new" };
      if (move) for (let i = 0; i < this.size; i++) if (backlogs[i]! < backlogs[placed.member]!) placed.member = i;
    }
    this.homes.delete(key);
    this.homes.set(key, { member: placed.member, chars });
    if (this.homes.size > this.maxRemembered) this.homes.delete(this.homes.keys().next().value!);
    return placed;
  }

  /**
   * Forgets the conversations member `member` held: it was replaced, its segment cache lost, so their next turns
   * cost it as much as any member (a new conversation's placement).
   */
  forget(member: number): void {
    for (const [key, home] of this.homes) if (home.member === member) this.homes.delete(key);
  }

  /** Forgets every conversation. */
  clear(): void {
    this.homes.clear();
  }

  /** Conversations remembered now. */
  get remembered(): number {
    return this.homes.size;
  }
}

/**
 * Reading a body (UTF-8 decode, JSON.parse, validation) took ~5-7 ms a MiB of the trace's chats, against ~77 ms for
 * a MiB of fresh characters (13k a ms): a byte read counts as 0.07 of a fresh character.
 */
const READ_BYTE_COST = 0.07;

/**
 * A body's bytes past which none can hold routed text: a routed character (a UTF-16 unit) is at most 3 bytes of
 * UTF-8. Counted in bytes, an ASCII body past 128 KiB looks up to 3x its routed text; counted against 128 Ki, a
 * CJK conversation's turns between 128 and 384 KiB would look cached (only text written as \u escapes still can).
 */
const ROUTED_BYTES_MAX = 3 * ROUTING_TEXT_CHARS;

/**
 * A job's work on a member, in fresh characters: what it tokenizes (of a body, its bytes up to ROUTED_BYTES_MAX;
 * a 1 MB chat tokenizes only its first 128 Ki characters) and, for a body, reading it.
 */
export function jobWork(job: PoolJob): { chars: number; read: number } {
  if (job.kind !== "body") return { chars: jobChars(job), read: 0 };
  const bytes = job.request.body.byteLength;
  return { chars: Math.min(bytes, ROUTED_BYTES_MAX), read: bytes * READ_BYTE_COST };
}

/**
 * The characters a job renders, about (message texts or the prompt; template text and tools left out). A body
 * not read yet counts its bytes: JSON quoting and field names over-count a little, multi-byte text under-counts.
 */
export function jobChars(job: PoolJob): number {
  switch (job.kind) {
    case "body":
      return job.request.body.byteLength;
    case "prompt":
      return job.text.length;
    case "chat": {
      let n = 0;
      for (const m of job.messages) {
        if (typeof m.content === "string") n += m.content.length;
        else if (Array.isArray(m.content)) for (const p of m.content) n += typeof p.text === "string" ? p.text.length : 0;
      }
      return n;
    }
  }
}
