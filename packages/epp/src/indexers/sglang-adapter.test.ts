import { expect, test } from "bun:test";
import { sglangModel } from "./sglang-adapter.ts";

test("sglangModel: the model's own adapter wins, else lora_path is the adapter, as SGLang's _resolve_lora_path", () => {
  expect(sglangModel("m", undefined)).toBe("m");
  expect(sglangModel("m", "sql")).toBe("m:sql");
  expect(sglangModel("m:chat", "sql")).toBe("m:chat");
  expect(sglangModel("m:", "sql")).toBe("m:sql");
  expect(sglangModel(undefined, "sql")).toBeUndefined();
});
