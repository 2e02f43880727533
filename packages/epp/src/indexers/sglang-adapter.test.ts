import { expect, test } from "bun:test";
import { MAX_ADAPTER_NAME, sglangAdapterForm, sglangModel } from "./sglang-adapter.ts";

test("sglangModel: the model's own adapter wins, else lora_path is the adapter, as SGLang's _resolve_lora_path", () => {
  expect(sglangModel("m", undefined)).toBe("m");
  expect(sglangModel("m", "sql")).toBe("m:sql");
  expect(sglangModel("m:chat", "sql")).toBe("m:chat");
  expect(sglangModel("m:", "sql")).toBe("m:sql");
  expect(sglangModel(undefined, "sql")).toBeUndefined();
});

test("an adapter name past MAX_ADAPTER_NAME is no adapter: it would be hashed into every block on the decision thread", () => {
  const long = "a".repeat(MAX_ADAPTER_NAME + 1);
  const longest = "a".repeat(MAX_ADAPTER_NAME);
  expect(sglangModel("m", long)).toBe("m");
  expect(sglangModel("m", longest)).toBe(`m:${longest}`);
  expect(sglangAdapterForm(`m:${long}`)).toBeUndefined();
  expect(sglangAdapterForm(`m:${longest}`)).toEqual({ base: "m", adapter: longest });
});
