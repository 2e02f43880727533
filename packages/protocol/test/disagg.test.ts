import { expect, test } from "bun:test";
import { PD_SPLIT_PATHS, splitPath } from "../src/index.ts";

test("splitPath: a split path with or without a query; anything else, a prefix or an extension of one included, is not", () => {
  for (const p of PD_SPLIT_PATHS) expect(splitPath(p)).toBe(p);
  expect(splitPath("/v1/responses?stream=1")).toBe("/v1/responses");
  for (const p of [undefined, "", "/v1/embeddings", "/v1/completions/render", "/v1/messages/count_tokens", "/v1", "/v1/responses/", "/inference/v1/generate2"]) expect(splitPath(p)).toBeUndefined();
});
