// Which pool member a job calls home: the one whose segment cache holds its conversation's earlier turns.
// A key from the job's first sections, which a conversation's turns share: its first two messages, or a
// prompt's start; for a body as received, the same read off its bytes by a bounded scan (no parse).
import type { PoolJob } from "../job";

/** Bytes of a message (or of a prompt's start) that go into the key, at most. */
const WINDOW = 4096;

/** FNV-1a over the job's first sections: a member index is `affinityKey(job) % size`. */
export function affinityKey(job: PoolJob): number {
  if (job.kind === "body") return bodyKey(job.request.body);
  let h = FNV_OFFSET;
  const mix = (s: string) => {
    for (let i = 0; i < s.length && i < WINDOW; i++) h = Math.imul(h ^ s.charCodeAt(i), FNV_PRIME);
  };
  if (job.kind === "prompt") mix(job.text);
  else {
    for (const m of job.messages.slice(0, 2)) {
      mix(m.role);
      mix(typeof m.content === "string" ? m.content : JSON.stringify(m.content ?? "").slice(0, WINDOW));
    }
  }
  return h >>> 0;
}

const FNV_OFFSET = 0x811c9dc5;
const FNV_PRIME = 0x01000193;
// The keys whose values carry a conversation's start: a chat's messages, a Responses request's input items,
// a completion's prompt.
const KEYS = ["messages", "input", "prompt"].map((k) => Buffer.from(`"${k}"`));

/**
 * A body's key, from its bytes: the first of `"messages"`, `"input"`, `"prompt"` found in the body's first
 * WINDOW bytes, then its value up to the end of its second object (two messages or input items) but at most
 * 2 x WINDOW bytes; else the body's first WINDOW bytes. The same conversation's turns, written by the same
 * client, share those bytes, and a turn's later messages and fields are left out, so they do not move it
 * elsewhere. Reads a few KiB whatever the body's size. A key found inside a string (a system prompt quoting
 * "messages") only makes the key less apt, never wrong: any key is a valid home.
 */
function bodyKey(body: Uint8Array): number {
  const head = Buffer.from(body.buffer, body.byteOffset, Math.min(body.length, WINDOW));
  let at = -1;
  let start = 0;
  for (const k of KEYS) {
    const i = head.indexOf(k);
    if (i >= 0 && (at < 0 || i < at)) [at, start] = [i, i + k.length];
  }
  if (at < 0) return mixBytes(FNV_OFFSET, body, 0, head.length) >>> 0;
  return mixBytes(FNV_OFFSET, body, start, firstObjectsEnd(body, start, Math.min(body.length, start + 2 * WINDOW))) >>> 0;
}

/** Just past the second object closed at the top level of the value at `from`, or `limit`. Strings are skipped whole. */
function firstObjectsEnd(b: Uint8Array, from: number, limit: number): number {
  let depth = 0;
  let objects = 0;
  for (let i = from; i < limit; i++) {
    const c = b[i]!;
    if (c === 0x22) i = stringEnd(b, i, limit);
    else if (c === 0x5b || c === 0x7b) depth++;
    else if (c === 0x5d || c === 0x7d) {
      depth--;
      if (depth <= 0 || (depth === 1 && ++objects === 2)) return i + 1;
    }
  }
  return limit;
}

/** The offset of the quote that closes the string opening at `open` (or `limit`). */
function stringEnd(b: Uint8Array, open: number, limit: number): number {
  for (let i = open + 1; i < limit; i++) {
    if (b[i] === 0x5c) i++;
    else if (b[i] === 0x22) return i;
  }
  return limit;
}

function mixBytes(h: number, b: Uint8Array, from: number, to: number): number {
  for (let i = from; i < to; i++) h = Math.imul(h ^ b[i]!, FNV_PRIME);
  return h;
}
