// The token counts a response reports in its usage, read from its body as it passes: one scan per response,
// shared by the routing quality watch (the cached tokens it compares with the prediction) and the EPP's per-request
// token figures. Chunks are scanned as they come, with a short tail carried across chunks so a count split between
// two is read whole: O(bytes), nothing of the response kept.

/** The usage fields read, under the names each API spells them. */
const FIELD_RE = /"(prompt_tokens|input_tokens|completion_tokens|output_tokens|cached_tokens|cache_read_input_tokens)"\s*:\s*(\d+)/g;
// The final usage chunk of a stream is the one with no choices (vLLM, OpenAI): usage seen before it
// (vLLM's continuous_usage_stats on every chunk) carries no prompt_tokens_details.
const FINAL_USAGE_RE = /"choices"\s*:\s*\[\s*\]/;
// The counts are found in the last part of the body; a usage object is far shorter than this.
const CARRY = 256;

type Field = "prompt_tokens" | "input_tokens" | "completion_tokens" | "output_tokens" | "cached_tokens" | "cache_read_input_tokens";

/**
 * What a response's usage said, each the last value it carried (a stream's later usage supersedes its earlier: vLLM's
 * continuous usage counts up, Anthropic's message_delta carries the final output count). Undefined: not reported.
 */
export type ReportedUsage = {
  /**
   * prompt_tokens (chat and text completions), input_tokens (Responses, Messages). A Messages input_tokens leaves its
   * cache reads out (Anthropic's usage): read as given, as llm-d's parser reads it into the same histograms.
   */
  promptTokens?: number;
  /** completion_tokens, output_tokens. */
  completionTokens?: number;
  /** prompt_tokens_details / input_tokens_details cached_tokens, cache_read_input_tokens (Messages). */
  cachedTokens?: number;
};

export class UsageScan {
  private readonly last = new Map<Field, number>();
  private carry = "";
  /** A chunk with no choices has passed: a stream's final usage chunk. */
  finalUsage = false;

  /** A response body chunk, as the data plane passed it. */
  add(chunk: Uint8Array): void {
    if (chunk.length === 0) return;
    const text = this.carry + Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength).toString("latin1");
    FIELD_RE.lastIndex = 0;
    for (let m = FIELD_RE.exec(text); m; m = FIELD_RE.exec(text)) this.last.set(m[1] as Field, Number(m[2]));
    if (FINAL_USAGE_RE.test(text)) this.finalUsage = true;
    this.carry = text.length > CARRY ? text.slice(text.length - CARRY) : text;
  }

  /** The last value of one field as the response spelt it. */
  field(name: Field): number | undefined {
    return this.last.get(name);
  }

  /** The usage under any API's names. */
  usage(): ReportedUsage {
    const either = (a: Field, b: Field) => this.last.get(a) ?? this.last.get(b);
    return {
      promptTokens: either("prompt_tokens", "input_tokens"),
      completionTokens: either("completion_tokens", "output_tokens"),
      cachedTokens: either("cached_tokens", "cache_read_input_tokens"),
    };
  }
}
