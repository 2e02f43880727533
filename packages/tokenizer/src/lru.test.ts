import { expect, test } from "bun:test";
import { Lru } from "./lru";

test("past its bound the least recently used entry goes; a read makes an entry recent", () => {
  const lru = new Lru<string, number>(2);
  lru.set("a", 1);
  lru.set("b", 2);
  expect(lru.get("a")).toBe(1);
  lru.set("c", 3);
  expect(lru.get("b")).toBeUndefined();
  expect([lru.get("a"), lru.get("c"), lru.size]).toEqual([1, 3, 2]);
});
