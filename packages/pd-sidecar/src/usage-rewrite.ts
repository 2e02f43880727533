import { isObject, type SplitApi } from "./apis.ts";

/**
 * The decode worker computed almost nothing of the prompt (it read the prefill's KV), so its usage
 * would say the whole prompt was cached. As llm-d's sidecar does, the client is told the prefill
 * worker's count instead: what a cache really saved. Each API counts it in its own field (apis.ts:
 * `prompt_tokens_details.cached_tokens`, Responses' `input_tokens_details.cached_tokens`, Messages'
 * `cache_read_input_tokens`). A JSON answer is rewritten whole; an SSE stream line by line (only
 * `data:` lines that carry `"usage"`, so token chunks pass through untouched and unparsed).
 *
 * OpenAI's counts (prompt_tokens, Responses' input_tokens) are the whole prompt, cached tokens included:
 * only the cached count changes. Anthropic's input_tokens is the part no cache supplied. What vLLM's
 * Messages server writes (vllm-project/vllm, vllm/entrypoints/anthropic/serving.py): the stored versions
 * 0001948bc769 and 82df3f491008 set input_tokens to the chat's prompt_tokens and no cache field; the
 * description of its later merged change "Report cache usage in Anthropic /v1/messages API" says it sets
 * input_tokens = prompt_tokens - cached_tokens, cache_read_input_tokens = cached_tokens and
 * cache_creation_input_tokens = 0 when the chat's usage has prompt_tokens_details, and leaves the cache
 * fields out (input_tokens the whole prompt) when it has not. Either way the prompt is input_tokens plus cache_read_input_tokens (0 when absent),
 * so input_tokens is recomputed from that sum: the client reads the prefill's cache hits as read and the
 * rest of the prompt as input, as Anthropic counts them.
 */

const isCount = (n: unknown): n is number => typeof n === "number" && Number.isInteger(n) && n >= 0;

/** The cached-token count in a usage object, where the API keeps it. */
export function cachedIn(usage: unknown, api: SplitApi): number | undefined {
  if (!api.cached || !isObject(usage)) return undefined;
  const { details, key } = api.cached;
  const holder = details === undefined ? usage : usage[details];
  const n = isObject(holder) ? holder[key] : undefined;
  return isCount(n) ? n : undefined;
}

/**
 * The answer's usage: at its top (a JSON answer, an OpenAI usage chunk, an Anthropic message_delta), or
 * in the object an event carries (Responses' `response.completed`, Anthropic's `message_start`).
 */
function usageOf(answer: unknown): Record<string, unknown> | undefined {
  if (!isObject(answer)) return undefined;
  if (isObject(answer.usage)) return answer.usage;
  for (const inner of [answer.response, answer.message]) if (isObject(inner) && isObject(inner.usage)) return inner.usage;
  return undefined;
}

function setCached(answer: unknown, cachedTokens: number, api: SplitApi): boolean {
  const usage = usageOf(answer);
  if (!api.cached || !usage) return false;
  const { details, key, uncached } = api.cached;
  if (details === undefined) {
    const rest = uncached === undefined ? undefined : usage[uncached];
    if (uncached !== undefined && isCount(rest)) {
      const prompt = rest + (isCount(usage[key]) ? usage[key] : 0);
      const read = Math.min(cachedTokens, prompt);
      usage[uncached] = prompt - read;
      usage[key] = read;
    } else usage[key] = cachedTokens; // a usage without the other count (a bare delta): nothing to keep in step
  } else {
    // vLLM leaves the details null (or out) when nothing was cached: they are made.
    const d = usage[details];
    usage[details] = isObject(d) ? { ...d, [key]: cachedTokens } : { [key]: cachedTokens };
  }
  return true;
}

/** A JSON answer's text with the cached tokens replaced; unchanged when it is not JSON or has no usage. */
export function rewriteJson(text: string, cachedTokens: number, api: SplitApi): string {
  let answer: unknown;
  try {
    answer = JSON.parse(text);
  } catch {
    return text;
  }
  return setCached(answer, cachedTokens, api) ? JSON.stringify(answer) : text;
}

function rewriteLine(line: string, cachedTokens: number, api: SplitApi): string {
  if (!line.startsWith("data: ") || !line.includes('"usage"')) return line;
  const eol = line.endsWith("\r") ? "\r" : "";
  const data = line.slice(6, line.length - eol.length);
  const out = rewriteJson(data, cachedTokens, api);
  return out === data ? line : `data: ${out}${eol}`;
}

/** An SSE body with every usage's cached tokens replaced; lines split across reads are joined first. */
export function rewriteSse(body: ReadableStream<Uint8Array>, cachedTokens: number, api: SplitApi): ReadableStream<Uint8Array> {
  const decoder = new TextDecoder();
  const encoder = new TextEncoder();
  let pending = "";
  return body.pipeThrough(
    new TransformStream<Uint8Array, Uint8Array>({
      transform(chunk, out) {
        pending += decoder.decode(chunk, { stream: true });
        const cut = pending.lastIndexOf("\n");
        if (cut < 0) return;
        const complete = pending.slice(0, cut + 1);
        pending = pending.slice(cut + 1);
        out.enqueue(encoder.encode(complete.split("\n").map((l) => rewriteLine(l, cachedTokens, api)).join("\n")));
      },
      flush(out) {
        pending += decoder.decode();
        // A stream that ends without its last newline is malformed SSE: forwarded, still rewritten.
        if (pending.length > 0) out.enqueue(encoder.encode(rewriteLine(pending, cachedTokens, api)));
      },
    }),
  );
}
