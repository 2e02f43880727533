// Chat conversations from the trace's block structure. The trace holds no text, only which 512-token
// blocks prompts share, so each block id becomes deterministic English text of ~512 Qwen3 tokens (one
// word = one token: every word below is a single token with its leading space, and a block ends with
// ".\n", a token that also keeps the next block's first word from merging with it). Prompts that share
// blocks thus share their text prefix. A record whose prompt extends an earlier record's (the trace's
// next turn of a conversation) becomes that record's messages plus an assistant reply (the earlier
// turn's output_length of words) and a new user turn, so the rendered chat of the earlier turn is a
// prefix of this one's, as a client resending a growing conversation produces.
import { mulberry32 } from "@kv-epp/testkit";
import { TRACE_BLOCK_TOKENS, type TraceRecord } from "../trace.ts";

export type ChatTurn = { role: "user" | "assistant"; content: string };

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

/**
 * The messages of each record, built in arrival order. `messagesOf(i)` must be called for increasing
 * `i` (a record's conversation can only continue one that came before it).
 */
export class Conversations {
  private readonly built: ChatTurn[][] = [];
  /** full hash_ids → latest record with exactly those ids */
  private readonly byIds = new Map<string, number>();
  /** hash_ids without the last (partial) block → latest record */
  private readonly byIdsButLast = new Map<string, number>();

  constructor(private readonly records: readonly TraceRecord[]) {}

  messagesOf(i: number): ChatTurn[] {
    const cached = this.built[i];
    if (cached) return cached;
    if (i > this.built.length) throw new RangeError(`conversation ${i} asked before ${this.built.length}`);
    const rec = this.records[i]!;
    const messages = this.continuation(rec) ?? [{ role: "user" as const, content: spanText(rec.hashIds, 0, rec.inputLength) }];
    this.built.push(messages);
    this.byIds.set(rec.hashIds.join(","), i);
    if (rec.hashIds.length > 1) this.byIdsButLast.set(rec.hashIds.slice(0, -1).join(","), i);
    return messages;
  }

  /**
   * The earlier turn this record continues: the latest record whose ids are a prefix of this one's (its
   * last block may differ: a partial block changes its hash once the conversation extends it), sharing
   * more than the first block (which nearly every record shares: a common system prompt, not a turn).
   */
  private continuation(rec: TraceRecord): ChatTurn[] | undefined {
    const ids = rec.hashIds;
    for (let m = ids.length - 1; m >= 2; m--) {
      const key = ids.slice(0, m).join(",");
      const parent = this.byIds.get(key) ?? this.byIdsButLast.get(key);
      if (parent === undefined) continue;
      const prev = this.records[parent]!;
      const budget = rec.inputLength - prev.inputLength - TURN_OVERHEAD;
      if (budget < 32) return undefined;
      const reply = Math.min(Math.max(1, prev.outputLength), Math.floor(budget / 2));
      const at = prev.inputLength;
      return [
        ...this.built[parent]!,
        { role: "assistant", content: spanText(ids, at, at + reply) },
        { role: "user", content: spanText(ids, at + reply, at + budget) },
      ];
    }
    return undefined;
  }
}
