/**
 * The decode worker computed almost nothing of the prompt (it read the prefill's KV), so its
 * `usage.prompt_tokens_details.cached_tokens` would say the whole prompt was cached. As llm-d's
 * sidecar does, the client is told the prefill worker's count instead: what a cache really saved.
 * A JSON answer is rewritten whole; an SSE stream line by line (only `data:` lines that carry
 * `"usage"`, so token chunks pass through untouched and unparsed).
 */

function setCached(answer: unknown, cachedTokens: number): boolean {
  const usage = (answer as { usage?: unknown } | null)?.usage;
  if (typeof usage !== "object" || usage === null) return false;
  const u = usage as { prompt_tokens_details?: unknown };
  const details = u.prompt_tokens_details;
  u.prompt_tokens_details = typeof details === "object" && details !== null ? { ...details, cached_tokens: cachedTokens } : { cached_tokens: cachedTokens };
  return true;
}

/** A JSON answer's text with the cached tokens replaced; unchanged when it is not JSON or has no usage. */
export function rewriteJson(text: string, cachedTokens: number): string {
  let answer: unknown;
  try {
    answer = JSON.parse(text);
  } catch {
    return text;
  }
  return setCached(answer, cachedTokens) ? JSON.stringify(answer) : text;
}

function rewriteLine(line: string, cachedTokens: number): string {
  if (!line.startsWith("data: ") || !line.includes('"usage"')) return line;
  const eol = line.endsWith("\r") ? "\r" : "";
  const data = line.slice(6, line.length - eol.length);
  const out = rewriteJson(data, cachedTokens);
  return out === data ? line : `data: ${out}${eol}`;
}

/** An SSE body with every usage chunk's cached tokens replaced; lines split across reads are joined first. */
export function rewriteSse(body: ReadableStream<Uint8Array>, cachedTokens: number): ReadableStream<Uint8Array> {
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
        out.enqueue(encoder.encode(complete.split("\n").map((l) => rewriteLine(l, cachedTokens)).join("\n")));
      },
      flush(out) {
        pending += decoder.decode();
        // A stream that ends without its last newline is malformed SSE: forwarded, still rewritten.
        if (pending.length > 0) out.enqueue(encoder.encode(rewriteLine(pending, cachedTokens)));
      },
    }),
  );
}
