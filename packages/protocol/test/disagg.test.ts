import { expect, test } from "bun:test";
import { PD_SPLIT_PATHS, splitPath } from "../src/index.ts";

test("splitPath: a split API by apiOfPath's rule (query, trailing slash, gateway prefix); count_tokens and any other API or path is not split", () => {
  for (const p of PD_SPLIT_PATHS) expect(splitPath(p)).toBe(p);
  expect(splitPath("/v1/responses?stream=1")).toBe("/v1/responses");
  expect(splitPath("/v1/responses/")).toBe("/v1/responses");
  expect(splitPath("/llm/v1/messages?beta=true")).toBe("/v1/messages");
  for (const p of [undefined, "", "/v1/embeddings", "/v1/completions/render", "/v1/messages/count_tokens", "/llm/v1/messages/count_tokens", "/v1", "/inference/v1/generate2"]) expect(splitPath(p)).toBeUndefined();
});
