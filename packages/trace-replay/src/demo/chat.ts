// Chat conversations from the trace's block structure. The trace holds no text, only which 512-token
// blocks prompts share, so each block id becomes deterministic English text of ~512 Qwen3 tokens (one
// word = one token: every word below is a single token with its leading space, and a block ends with
// ".\n", a token that also keeps the next block's first word from merging with it). Prompts that share
// blocks thus share their text prefix. A record whose prompt extends an earlier record's (the trace's
// next turn of a conversation) becomes that record's messages plus an assistant reply and a new user
// turn, so the rendered chat of the earlier turn is a prefix of this one's, as a client resending a
// growing conversation produces. The reply is the one the client received when it has (what a chat
// client resends, in the role the response named, and what an EPP that saw the response could warm),
// else the earlier turn's output_length of the trace's text.
import { mulberry32 } from "@kv-epp/testkit";
import { TRACE_BLOCK_TOKENS, type TraceRecord } from "../trace.ts";

export type ChatTurn = { role: string; content: string };

/** A chat's reply as the client received it: its text, and the role the response named (none: "assistant"). */
export type ReceivedReply = { content: string; role?: string | undefined };

const WORDS = (
  "the of and to in is that for it as was with be by on not he this are or his from at which but have an " +
  "they you were her she there one all we their can has more will if no when would so what up out about " +
  "into than them its only some time other could these two may then do first any my now such like our over " +
  "man me even most made after also did many before must through back years where much your way well down " +
  "should because each just those people how too little state good very make world still own see men work " +
  "long get here between both life being under never day same another know while last might us great old " +
  "year off come since against go came right used take three"
).split(" ");

const END = ".\n";
const WORDS_PER_BLOCK = TRACE_BLOCK_TOKENS - 1;

const wordCache = new Map<number, Uint16Array>();
const fullTextCache = new Map<number, string>();

/** The word indices of block `id` (its first 511 tokens; the 512th is the block's END). */
function blockWords(id: number): Uint16Array {
  let w = wordCache.get(id);
  if (!w) {
    // Mixed first so neighbouring ids start apart (the same mixing as tokens.ts).
    const next = mulberry32((Math.imul(id ^ 0x9e3779b9, 0x85ebca6b) + 0x7f4a7c15) >>> 0);
    w = Uint16Array.from({ length: WORDS_PER_BLOCK }, () => next() % WORDS.length);
    wordCache.set(id, w);
  }
  return w;
}

/** The whole text of block `id`: 511 words and ".\n". */
export function blockText(id: number): string {
  let t = fullTextCache.get(id);
  if (t === undefined) {
    t = Array.from(blockWords(id), (i) => WORDS[i]).join(" ") + END;
    fullTextCache.set(id, t);
  }
  return t;
}

/**
 * Text of token positions [from, to) of a prompt made of `ids`' blocks: whole blocks as blockText, a
 * block cut short ends with "." instead of its ".\n".
 */
export function spanText(ids: readonly number[], from: number, to: number): string {
  let out = "";
  for (let p = from; p < to; ) {
    const b = Math.floor(p / TRACE_BLOCK_TOKENS);
    const id = ids[Math.min(b, ids.length - 1)]!;
    const start = p - b * TRACE_BLOCK_TOKENS;
    const end = Math.min(TRACE_BLOCK_TOKENS, to - b * TRACE_BLOCK_TOKENS);
    if (start === 0 && end === TRACE_BLOCK_TOKENS) out += blockText(id);
    else {
      const words = blockWords(id);
      const parts: string[] = [];
      for (let j = start; j < Math.min(end, WORDS_PER_BLOCK); j++) parts.push(WORDS[words[j]!]!);
      const sep = out === "" || out.endsWith("\n") ? "" : " ";
      out += sep + parts.join(" ") + (end === TRACE_BLOCK_TOKENS ? END : ".");
    }
    p = b * TRACE_BLOCK_TOKENS + end;
  }
  return out;
}

/** Tokens the chat template adds for one more exchange (end of turn, user header, assistant header). */
const TURN_OVERHEAD = 10;

/** How a record continues an earlier one: its reply's and its new user turn's token positions in its prompt. */
type Link = { parent: number; reply: [number, number]; user: [number, number] };

/** A record's messages as composed, and the earlier turns whose reply the trace's text stood in for. */
type Composed = { messages: ChatTurn[]; stoodIn: number[] };

/**
 * The messages of each record, linked in arrival order. `messagesOf(i)` must first be called for increasing
 * `i` (a record's conversation can only continue one that came before it). A turn that continues an earlier
 * one resends that turn's reply: the reply the client received (`replied`), as a chat client does, or, while
 * none has come, the trace's text in its place (`stale` tells when one came since).
 */
export class Conversations {
  private readonly links: (Link | null)[] = [];
  private readonly composed = new Map<number, Composed>();
  private readonly replies = new Map<number, ReceivedReply>();
  /** full hash_ids → latest record with exactly those ids */
  private readonly byIds = new Map<string, number>();
  /** hash_ids without the last (partial) block → latest record */
  private readonly byIdsButLast = new Map<string, number>();

  constructor(private readonly records: readonly TraceRecord[]) {}

  messagesOf(i: number): ChatTurn[] {
    if (i > this.links.length) throw new RangeError(`conversation ${i} asked before ${this.links.length}`);
    if (i === this.links.length) this.link(i);
    return this.compose(i).messages;
  }

  /** The reply the client received to record `i`: the turns continuing it resend it, in its role. */
  replied(i: number, reply: ReceivedReply): void {
    this.replies.set(i, reply);
  }

  /** Whether messagesOf(i) would now give other messages than before: a reply it stood in for has come. */
  stale(i: number): boolean {
    return this.composed.get(i)?.stoodIn.some((p) => this.replies.has(p)) ?? false;
  }

  /** Of the turns composed so far that continue an earlier one: those that resent its reply, and those that could not. */
  replyCounts(): { resent: number; stoodIn: number } {
    let resent = 0;
    let stoodIn = 0;
    for (const [i, c] of this.composed) {
      const link = this.links[i];
      if (link) c.stoodIn.includes(link.parent) ? stoodIn++ : resent++;
    }
    return { resent, stoodIn };
  }

  private compose(i: number): Composed {
    const known = this.composed.get(i);
    if (known !== undefined && !this.stale(i)) return known;
    const rec = this.records[i]!;
    const link = this.links[i]!;
    let c: Composed;
    if (link === null) c = { messages: [{ role: "user", content: spanText(rec.hashIds, 0, rec.inputLength) }], stoodIn: [] };
    else {
      const parent = this.compose(link.parent);
      const reply = this.replies.get(link.parent);
      c = {
        messages: [
          ...parent.messages,
          { role: reply?.role ?? "assistant", content: reply?.content ?? spanText(rec.hashIds, ...link.reply) },
          { role: "user", content: spanText(rec.hashIds, ...link.user) },
        ],
        stoodIn: reply === undefined ? [...parent.stoodIn, link.parent] : parent.stoodIn,
      };
    }
    this.composed.set(i, c);
    return c;
  }

  private link(i: number): void {
    const rec = this.records[i]!;
    this.links.push(this.continuation(rec));
    this.byIds.set(rec.hashIds.join(","), i);
    if (rec.hashIds.length > 1) this.byIdsButLast.set(rec.hashIds.slice(0, -1).join(","), i);
  }

  /**
   * The earlier turn this record continues: the latest record whose ids are a prefix of this one's (its
   * last block may differ: a partial block changes its hash once the conversation extends it), sharing
   * more than the first block (which nearly every record shares: a common system prompt, not a turn).
   * The reply is the earlier turn's output_length of the trace's text (at most half the new tokens).
   */
  private continuation(rec: TraceRecord): Link | null {
    const ids = rec.hashIds;
    for (let m = ids.length - 1; m >= 2; m--) {
      const key = ids.slice(0, m).join(",");
      const parent = this.byIds.get(key) ?? this.byIdsButLast.get(key);
      if (parent === undefined) continue;
      const prev = this.records[parent]!;
      const budget = rec.inputLength - prev.inputLength - TURN_OVERHEAD;
      if (budget < 32) return null;
      const reply = Math.min(Math.max(1, prev.outputLength), Math.floor(budget / 2));
      const at = prev.inputLength;
      return { parent, reply: [at, at + reply], user: [at + reply, at + budget] };
    }
    return null;
  }
}
