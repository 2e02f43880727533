// Which inference API a request's path names: one rule for the EPP (which reads the body by it and names a prefill
// worker only for the paths the P/D sidecar splits) and for the sidecar (which splits by it), so the two agree.

/**
 * The paths whose bodies kv-epp reads: OpenAI completions, chat and Responses, Anthropic Messages and its
 * count_tokens, vLLM's token-in generate.
 */
export const API_PATHS = [
  "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens", "/inference/v1/generate",
] as const;

export type ApiPath = (typeof API_PATHS)[number];

/**
 * The API a request's `:path` names, or undefined. The query is dropped (Claude Code sends `/v1/messages?beta=true`)
 * and so is one trailing slash (vLLM's server redirects it to the path without); what is left is an API path, or
 * ends with one after a prefix of whole segments: Envoy's ext_proc sees the path the client sent, before the
 * route's URL rewrite, so a gateway prefix (`/llm/v1/messages`, rewritten to `/v1/messages` for the worker) names
 * the same API. Anything past the API path names another endpoint (`/v1/messages/count_tokens` is not
 * `/v1/messages`, `/v1/responses/{id}` is not `/v1/responses`), and so does a rewrite that replaces the `/v1`.
 */
export function apiOfPath(path: string | undefined): ApiPath | undefined {
  if (path === undefined) return undefined;
  const q = path.indexOf("?");
  let bare = q < 0 ? path : path.slice(0, q);
  if (bare.length > 1 && bare.endsWith("/")) bare = bare.slice(0, -1);
  // No API path ends another, so at most one matches; each opens with "/", so a match starts on a segment.
  return API_PATHS.find((api) => bare.endsWith(api));
}
