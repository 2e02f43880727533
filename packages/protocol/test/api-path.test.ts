import { expect, test } from "bun:test";
import { API_PATHS, apiOfPath } from "../src/api-path.ts";

test("apiOfPath: each API path names itself", () => {
  for (const p of API_PATHS) expect(apiOfPath(p)).toBe(p);
});

test.each([
  // [path as ext_proc or the sidecar sees it, the API it names]
  ["/v1/messages?beta=true", "/v1/messages"], // Claude Code's query
  ["/v1/messages/?beta=true", "/v1/messages"],
  ["/v1/chat/completions/", "/v1/chat/completions"], // vLLM redirects a trailing slash to the path without
  ["/llm/v1/messages", "/v1/messages"], // a gateway prefix, rewritten away before the worker
  ["/llm/v1/messages/count_tokens?beta=true", "/v1/messages/count_tokens"],
  ["/teams/a/v1/chat/completions", "/v1/chat/completions"],
  ["/openai/v1/responses", "/v1/responses"],
  ["/llm/inference/v1/generate", "/inference/v1/generate"],
  ["/v1/completions?stream=1", "/v1/completions"],
] as const)("apiOfPath(%p) is %p", (path, api) => {
  expect(apiOfPath(path)).toBe(api);
});

test.each([
  undefined, "", "/", "/v1", "/v1/",
  "/v1/messages/batches", // another endpoint under the Messages path
  "/v1/responses/resp_1", "/v1/responses/resp_1/cancel",
  "/v1/completions/render", "/v1/chat/completions/render",
  "/v1/embeddings", "/generate", // SGLang's native generate is not vLLM's
  "/inference/v1/generate2", "/xv1/messages", "/llmv1/chat/completions", // no segment boundary before the API path
  "/messages", "/llm/messages", "/chat/completions", // a rewrite that replaces /v1 is not followed
  "/v1/messages//", "/V1/messages", // one trailing slash only; paths are case-sensitive, as vLLM's routes
  "?/v1/messages", "/health?next=/v1/messages", // the query is never the path
])("apiOfPath(%p) names no API", (path) => {
  expect(apiOfPath(path)).toBeUndefined();
});
