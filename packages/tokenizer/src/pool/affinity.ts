// Which pool member a job calls home: the one whose segment cache holds its conversation's earlier turns.
// A key from the conversation's start, which all its turns share: its system prompt(s) and first user turn, or a
// prompt's start; for a body as received, the same read off its bytes by a bounded scan (no parse). Not the
// first two messages: without a system prompt, turn 1 ([u1]) and turn 2 ([u1, a1, u2]) would part.
// A body's key and a parsed job's key are not equal (bytes against decoded text): each groups the same turns,
// and a flow keeps to one kind (the EPP sends bodies and warms replies as bodies; nextTurnJob keys like its turn).
import { FNV_OFFSET, hashRange } from "../fast/fnv";
import type { PoolJob } from "../job";
import { skipSpace, stringEnd } from "../request/openai-body";

/** Bytes of a message (or of a prompt's start) that go into the key, at most. */
const WINDOW = 4096;

/** Roles that come before the conversation proper: the key takes them and the first message of another role. */
const LEADING_ROLES = new Set(["system", "developer"]);

/**
 * A hash of the job's conversation start: a member index is `affinityKey(job) % size`. A body's bytes go through
 * Bun's native xxHash32 (the decision thread keys every body it receives: ~2 µs a trace chat against ~9 µs for an
 * FNV-1a loop in JS over the same bytes); a parsed job's text, FNV-1a over its UTF-16 code units.
 */
export function affinityKey(job: PoolJob): number {
  if (job.kind === "body") return bodyKey(job.request.body);
  let h = FNV_OFFSET;
  // At most as many characters as a body's scan reads bytes, whatever the number of system messages.
  let left = 2 * WINDOW;
  const mix = (s: string) => {
    const n = Math.min(s.length, WINDOW, left);
    h = hashRange(h, s, 0, n);
    left -= n;
  };
  if (job.kind === "prompt") mix(job.text);
  else {
    for (const m of job.messages) {
      mix(m.role);
      mix(typeof m.content === "string" ? m.content : JSON.stringify(m.content ?? "").slice(0, WINDOW));
      if (!LEADING_ROLES.has(m.role) || left === 0) break;
    }
  }
  return h >>> 0;
}

// The keys whose values carry a conversation's start: a chat's messages, a Responses request's input items,
// a completion's prompt.
const KEYS = ["messages", "input", "prompt"].map((k) => Buffer.from(`"${k}"`));

/**
 * A body's key, from its bytes: the first of `"messages"`, `"input"`, `"prompt"` found in the body's first
 * WINDOW bytes, then its value up to the end of its first item that is not a system or developer message (a
 * string value: up to its end), but at most 2 x WINDOW bytes; else the body's first WINDOW bytes. The same
 * conversation's turns, written by the same client, share those bytes, and a turn's later messages and fields
 * are left out, so they do not move it elsewhere. Reads a few KiB whatever the body's size. A key found inside a
 * string (a system prompt quoting "messages") or a role misread only makes the key less apt, never wrong: any
 * key is a valid home.
 */
function bodyKey(body: Uint8Array): number {
  const head = Buffer.from(body.buffer, body.byteOffset, Math.min(body.length, WINDOW));
  let at = -1;
  let start = 0;
  for (const k of KEYS) {
    const i = head.indexOf(k);
    if (i >= 0 && (at < 0 || i < at)) [at, start] = [i, i + k.length];
  }
  if (at < 0) return Bun.hash.xxHash32(head);
  return Bun.hash.xxHash32(body.subarray(start, conversationStartEnd(body, start, Math.min(body.length, start + 2 * WINDOW))));
}

/**
 * Just past the value at `from` if it is a string, else past its first item (an object or array closed at depth
 * 1) other than a system or developer message, or past the value, or `limit`. Strings are skipped whole; an
 * item's role is read from its own `"role"` key, JSON whitespace allowed around the colon.
 */
function conversationStartEnd(b: Uint8Array, from: number, limit: number): number {
  const value = valueStart(b, from, limit);
  if (value < limit && b[value] === QUOTE) {
    const end = stringEnd(b, value, limit);
    return end < 0 ? limit : end;
  }
  let depth = 0;
  let leading = false;
  for (let i = from; i < limit; i++) {
    const c = b[i]!;
    if (c === QUOTE) {
      const end = stringEnd(b, i, limit);
      if (end < 0) return limit;
      if (depth === 2 && !leading) leading = isLeadingRole(b, i, end, limit);
      i = end - 1;
    } else if (c === 0x5b || c === 0x7b) depth++;
    else if (c === 0x5d || c === 0x7d) {
      depth--;
      if (depth <= 0 || (depth === 1 && !leading)) return i + 1;
      if (depth === 1) leading = false;
    }
  }
  return limit;
}

const QUOTE = 0x22;
const COLON = 0x3a;
const ROLE = Buffer.from("role");
const LEADING_ROLE_BYTES = [...LEADING_ROLES].map((r) => Buffer.from(r));

/** The offset of a value's first byte, past the whitespace and colon after its key (`from`: just past the key). */
function valueStart(b: Uint8Array, from: number, limit: number): number {
  const i = skipSpace(b, from, limit);
  return i < limit && b[i] === COLON ? skipSpace(b, i + 1, limit) : i;
}

/** Whether the string at [`open`, `end`) is a `"role"` key whose value is a system or developer role. */
function isLeadingRole(b: Uint8Array, open: number, end: number, limit: number): boolean {
  if (!isString(b, open, end, ROLE)) return false;
  const colon = skipSpace(b, end, limit);
  if (colon >= limit || b[colon] !== COLON) return false;
  const value = skipSpace(b, colon + 1, limit);
  if (value >= limit || b[value] !== QUOTE) return false;
  const valueEnd = stringEnd(b, value, limit);
  return valueEnd > 0 && LEADING_ROLE_BYTES.some((r) => isString(b, value, valueEnd, r));
}

/** Whether the string at [`open`, `end`) holds exactly `text` (as written, quotes excluded). */
function isString(b: Uint8Array, open: number, end: number, text: Buffer): boolean {
  return end - open - 2 === text.length && text.equals(b.subarray(open + 1, end - 1));
}
