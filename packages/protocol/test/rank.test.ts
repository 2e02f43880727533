import { describe, expect, test } from "bun:test";
import { parseWorkerKey, workerKey, workerKeyOf } from "../src/index.ts";

describe("worker key", () => {
  test("is the worker id and dp rank joined by NUL, and splits back", () => {
    expect(workerKey({ workerId: "w-0", dpRank: 3 })).toBe("w-0\u00003");
    expect(workerKeyOf("w-0", 3)).toBe(workerKey({ workerId: "w-0", dpRank: 3 }));
    expect(parseWorkerKey("pod:a\u000012")).toEqual({ workerId: "pod:a", dpRank: 12 });
  });
  test("a string without NUL is not a key", () => {
    expect(() => parseWorkerKey("w-0/3")).toThrow(/not a worker key/);
  });
});
